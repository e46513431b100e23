"""An env in another process: `agentrl serve-env ENV --port N` and `--env http://HOST:PORT`, on
loopback. Training (GRPO, FOCUS through snapshot handles, Ray rollout workers) against a
served env, the same episodes as in process, retried calls applied once, the snapshot bound,
and the one-line errors when the server is gone."""
from __future__ import annotations

import gc
import json
import os
import pickle
import random
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl_cli import api, config
from agentrl_cli.cli.main import app
from agentrl_cli.envs import remote
from agentrl_cli.envs.base import make_env_spec
from agentrl_cli.envs.env_server import EnvServer, serve_in_thread
from agentrl_cli.envs.guard import EnvContractError
from agentrl_cli.errors import ConfigError
from conftest import MICRO, set_args

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
SEARCH = config.load(sets=["env.max_turns=3"]).env     # the served env's section
# a small world for training runs: the checks before a run reset every task once, over HTTP
SMALL = ["env.n_train=16", "env.n_eval=4"]


@pytest.fixture(scope="module")
def served():
    """`agentrl serve-env search --port 0` in a subprocess: its URL, read from its first line."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "agentrl_cli.cli.main", "serve-env", "search",
                             "--port", "0", "--set", "env.max_turns=3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    assert line.startswith("serving env 'search' at http://127.0.0.1:"), line + proc.stderr.read()
    yield line.split(" at ", 1)[1].split()[0], proc
    proc.terminate()
    proc.wait(timeout=10)


def _health(url: str) -> dict:
    with urllib.request.urlopen(url + "/health", timeout=10) as r:
        return json.loads(r.read())


def _steps(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("method", ["grpo", "focus", "vineppo"])
def test_training_steps_on_a_served_env(method, served, model_dir, tmp_path):
    url, _ = served
    before = _health(url)
    out = tmp_path / method
    extra = ["algo.focus_roots=1"] if method == "focus" else []   # 1 root per task: it branches
    res = runner.invoke(app, ["train", "--method", method, "--env", url, "--model", model_dir,
                              "--out", str(out), *set_args(["train.steps=2", *SMALL, *extra])])
    assert res.exit_code == 0, res.output
    rows = _steps(out)
    assert [r["step"] for r in rows] == [0, 1, 2] and all(r["rollout/tokens"] > 0 for r in rows[1:])
    assert json.loads((out / "config.json").read_text())["env"]["name"] == url
    after = _health(url)
    if method != "grpo":   # FOCUS and VinePPO forked through the server's snapshot handles
        assert after["snapshots"] > before["snapshots"]
        assert method == "vineppo" or sum(r.get("focus/continuations", 0) for r in rows) > 0
    assert after["episodes"] <= after["max_episodes"]
    if method == "grpo":   # the run on the env in process computes the same numbers
        here = tmp_path / "here"
        res = runner.invoke(app, ["train", "--method", method, "--env", "search", "--model",
                                  model_dir, "--out", str(here), *set_args(["train.steps=2", *SMALL])])
        assert res.exit_code == 0, res.output
        keys = ("reward/mean", "loss/policy", "rollout/tokens")
        assert [[r.get(k) for k in keys] for r in _steps(here)] == [[r.get(k) for k in keys] for r in rows]


@pytest.mark.parametrize("policy", ["model", "expert"])
def test_rollout_of_a_served_env(policy, served, model_dir, tmp_path):
    """`agentrl rollout --env URL`: the model's episodes, and the served env's scripted expert's
    (through `/expert`): the same episodes as on the env in process."""
    url, _ = served
    rows = {}
    for env in (url, "search"):
        out = tmp_path / f"{len(rows)}.jsonl"
        res = runner.invoke(app, ["rollout", "--env", env, "--policy", policy, "--model", model_dir,
                                  "--n", "4", "--out", str(out), *set_args(SMALL)])
        assert res.exit_code == 0, res.output
        rows[env] = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows[url]) == 4 and all(r["token_ids"] for r in rows[url])
    assert [(r["token_ids"], r["reward"], r["finish"]) for r in rows[url]] == \
           [(r["token_ids"], r["reward"], r["finish"]) for r in rows["search"]]


def test_ray_rollout_workers_train_on_a_served_env(served, model_dir, tmp_path):
    pytest.importorskip("ray")
    url, _ = served
    out = tmp_path / "ray"
    res = runner.invoke(app, ["train", "--method", "grpo", "--env", url, "--model", model_dir,
                              "--out", str(out), "--rollout-workers", "1",
                              *set_args(["train.steps=1", *SMALL])])
    assert res.exit_code == 0, res.output
    rows = _steps(out)
    assert [r["step"] for r in rows] == [0, 1] and rows[1]["rollout/tokens"] > 0


def test_check_env_passes_a_served_env(served):
    """`agentrl check-env URL`: the protocol over HTTP, the fork check through handles and the
    determinism check (a second spec from the same seed) included."""
    url, _ = served
    res = runner.invoke(app, ["check-env", url, *(a for s in ["env.max_turns=3", *SMALL] for a in ("--set", s))])
    assert res.exit_code == 0, res.output
    assert f"ok: env '{url}': 16 train / 4 eval tasks" in res.output
    assert "snapshot/restore exact at" in res.output and "scripted expert: yes" in res.output


def _play(spec, local, n: int = 2) -> list:
    """What `spec`'s envs see under the actions of `local`'s scripted expert (seeded) on the
    first `n` eval tasks: observations, rewards and ends, and a fork's replay from each state."""
    out, rng = [], random.Random(3)
    for task, here in zip(spec.tasks("eval", n), local.tasks("eval", n)):
        env, driver = spec.make(), local.make()
        out.append(env.reset(task))
        driver.reset(here)
        for _ in range(5):
            snap = env.snapshot()
            action = local.expert(driver, rng, 0.3)
            driver.step(action)
            res = env.step(action)
            fork = spec.make()
            fork.restore(snap)
            again = fork.step(action)
            out += [(res.observation, res.reward, res.terminated, res.truncated),
                    (again.observation, again.reward, again.terminated, again.truncated)]
            if res.terminated or res.truncated:
                break
    return out


def test_a_served_env_plays_as_the_env_in_process(served):
    url, _ = served
    served_spec = remote.connect(url, seed=0, max_turns=3)
    local = make_env_spec(SEARCH)
    assert [t.prompt for t in served_spec.tasks("train", 5)] == [t.prompt for t in local.tasks("train", 5)]
    assert served_spec.make().system_prompt == local.make().system_prompt
    assert served_spec.tool_schemas == json.loads(json.dumps(local.tool_schemas))
    played = _play(served_spec, local)
    assert played == _play(local, local) and len(played) > 6


def test_a_retried_call_is_applied_once(monkeypatch):
    """The server answers but the answer is lost (a dropped connection): the client retries
    with the same request id and the env has stepped once, so the episode is the one in
    process, truncated at the same step."""
    with serve_in_thread(EnvServer(SEARCH)) as running:
        spec = remote.connect(running.url, max_turns=3, remote_retries=1)
        real, lost = remote.Connection._once, []

        def answer_lost(self, method, path, body):
            answer = real(self, method, path, body)
            if path == "/step" and body not in lost:   # each step's first answer is lost
                lost.append(body)
                raise ConnectionResetError("connection reset by peer")
            return answer

        monkeypatch.setattr(remote.Connection, "_once", answer_lost)
        task = spec.tasks("eval", 1)[0]
        env, here = spec.make(), make_env_spec(SEARCH).make()
        assert env.reset(task) == here.reset(make_env_spec(SEARCH).tasks("eval", 1)[0])
        for action in ["search(x)", "search(y)", "search(z)"]:
            got, want = env.step(action), here.step(action)
            assert (got.observation, got.truncated) == (want.observation, want.truncated)
        assert len(lost) == 3 and got.truncated


def test_the_server_keeps_a_bounded_number_of_snapshots_and_releases_them():
    with serve_in_thread(EnvServer(SEARCH, max_snapshots=2)) as running:
        spec = remote.connect(running.url, max_turns=3)
        env = spec.make()
        env.reset(spec.tasks("eval", 1)[0])
        first, *_ = [env.snapshot() for _ in range(3)]
        assert len(running.server.snapshots) == 2
        with pytest.raises(EnvContractError, match=r"was released.*--max-snapshots\)$"):
            spec.make().restore(first)
        fork = spec.make()
        fork.restore(env.snapshot())         # a handle still held restores
        del env, fork                        # dropped envs are released on the next call
        spec.tasks("eval", 1)
        # the restored handle, dropped, went too; the last of `_` is held
        assert len(running.server.episodes) == 0 and list(running.server.snapshots) == [_[-1].snapshot_id]
        # a dropped handle is released with the next call, unless it was ever pickled (a Ray
        # worker or a copy may still restore it)
        env = spec.make()
        env.reset(spec.tasks("eval", 1)[0])
        kept, shared = env.snapshot(), env.snapshot()
        copy = pickle.loads(pickle.dumps(shared))
        kept_id, shared_id = kept.snapshot_id, shared.snapshot_id
        assert set(running.server.snapshots) == {kept_id, shared_id} and copy == shared
        del kept, shared, copy
        spec.tasks("eval", 1)
        assert list(running.server.snapshots) == [shared_id]
        # a spec that goes sends what it had still to release
        env = spec.make()
        env.reset(spec.tasks("eval", 1)[0])
        env.snapshot()
        assert len(running.server.episodes) == 1
        del env, spec, _, first
        gc.collect()
        assert len(running.server.episodes) == 0 and list(running.server.snapshots) == [shared_id]


def test_the_server_gone_mid_run_is_one_line(monkeypatch):
    monkeypatch.setattr(remote, "BACKOFF_S", 0.01)
    running = serve_in_thread(EnvServer(SEARCH))
    spec = remote.connect(running.url, max_turns=3, remote_retries=1)
    env = spec.make()
    env.reset(spec.tasks("eval", 1)[0])
    running.close()
    with pytest.raises(EnvContractError) as e:
        env.step("search(x)")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"env '{running.url}': the env server is gone")
    assert "failed 2 time(s)" in msg and "agentrl serve-env" in msg


def test_no_server_is_one_line_exit_2(monkeypatch, tmp_path, model_dir):
    monkeypatch.setattr(remote, "BACKOFF_S", 0.01)
    with serve_in_thread(EnvServer(SEARCH)) as running:   # a port nothing listens on after this
        url = running.url
    res = runner.invoke(app, ["train", "--method", "grpo", "--env", url, "--model", model_dir,
                              "--out", str(tmp_path / "run"), *set_args(["train.steps=1"])])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: env '{url}': no env server answers"), res.output
    assert f"agentrl serve-env ENV --port {url.rsplit(':', 1)[1]}" in lines[0]


def test_an_option_the_served_env_does_not_take_is_one_line():
    with serve_in_thread(EnvServer(SEARCH)) as running:
        with pytest.raises(ConfigError, match="the server refused: env 'search' has no option 'n_opz'"):
            remote.connect(running.url, n_opz=3)


def test_the_python_api_serves_and_trains(model_dir, tmp_path):
    with api.serve_env("search", sets={"env.max_turns": 3}) as running:
        cfg = api.load_config(sets=[*MICRO, "train.steps=1", *SMALL], method="grpo", env=running.url,
                              model=model_dir)
        summary = api.train(cfg, tmp_path / "run", log=lambda s: None)
        assert running.server.calls > 0
    assert [r["step"] for r in _steps(Path(summary["out"]))] == [0, 1]


CALLS_ENV = '''
from agentrl_cli.envs import StepResult, Task
from agentrl_cli.envs.tool_calls import function_tool


class Env:
    system_prompt = "call add(a, b)"

    def reset(self, task):
        self.calls = []
        return task.prompt

    def step(self, action):
        return StepResult("text: " + action, 0.0, False, False, {})

    def step_call(self, name, arguments):
        self.calls.append((name, arguments))
        return StepResult(f"{name}: {arguments['a'] + arguments['b']}", 0.0, False, False, {})

    def snapshot(self):
        return list(self.calls)

    def restore(self, state):
        self.calls = list(state)


class Spec:
    tool_schemas = [function_tool("add", "Adds.", a=("integer", "a"), b=("integer", "b"))]

    def make(self):
        return Env()

    def tasks(self, split, n=None):
        return [Task("t0", "add 2 and 3", "5")][:n]


def make(seed=0):
    return Spec()
'''


def test_json_tool_calls_reach_a_served_envs_step_call(tmp_path):
    """Under a JSON tool format (model.tool_format=hermes) a call reaches the served env's
    `step_call` with its arguments as JSON; a message without one reaches its `step`."""
    from agentrl_cli.envs.tool_calls import tool_spec

    (tmp_path / "calls_env.py").write_text(CALLS_ENV)
    section = config.load(**{"env.name": f"{tmp_path / 'calls_env.py'}:make"}).env
    with serve_in_thread(EnvServer(section)) as running:
        spec = tool_spec(remote.connect(running.url), "hermes", running.url)
        env = spec.make()
        env.reset(spec.tasks("eval")[0])
        res = env.step('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>')
        assert res.observation == "add: 5"
        assert env.inner.snapshot() == env.inner.snapshot()   # the same server-side state twice


def test_a_killed_server_process_is_one_line(monkeypatch):
    monkeypatch.setattr(remote, "BACKOFF_S", 0.01)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "agentrl_cli.cli.main", "serve-env", "search",
                             "--port", "0"], stdout=subprocess.PIPE, text=True, env=env)
    url = proc.stdout.readline().split(" at ", 1)[1].split()[0]
    spec = remote.connect(url, max_turns=3, remote_retries=1)
    live = spec.make()
    live.reset(spec.tasks("eval", 1)[0])
    proc.kill()
    proc.wait(timeout=10)
    with pytest.raises(EnvContractError, match=r"^env 'http://127\.0\.0\.1:\d+': the env server is gone: "
                                               r"POST /step failed 2 time\(s\) \(.*\); is `agentrl serve-env` still running"):
        live.step("search(x)")


def test_a_served_envs_oracle_value_after_a_fork():
    """`algo.focus_critic=oracle` reads `env.oracle_value()`: a served env that has one (the
    allocation env) answers it, for a fresh env restored from a handle as in process."""
    section = config.load(**{"env.name": "allocation"}).env
    local = make_env_spec(section)
    with serve_in_thread(EnvServer(section)) as running:
        spec = remote.connect(running.url)
        assert not hasattr(spec.make(), "step_call")     # allocation has none: text calls
        for task, here in zip(spec.tasks("eval", 3), local.tasks("eval", 3)):
            env, twin = spec.make(), local.make()
            env.reset(task), twin.reset(here)
            action = local.expert(twin, random.Random(0))
            env.step(action), twin.step(action)
            fork = spec.make()
            fork.restore(env.snapshot())
            assert fork.oracle_value() == twin.oracle_value()


def test_serve_env_mistakes_are_one_line_exit_2():
    res = runner.invoke(app, ["serve-env", "serch", "--port", "0"])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "unknown env 'serch'" in res.output, res.output
    with serve_in_thread(EnvServer(SEARCH)) as running:      # its port is taken
        port = running.url.rsplit(":", 1)[1]
        res = runner.invoke(app, ["serve-env", "search", "--port", port])
    assert res.exit_code == 2 and res.output.startswith(f"error: serve-env: cannot listen on 127.0.0.1:{port}"), res.output
    assert res.output.count("\n") == 1
