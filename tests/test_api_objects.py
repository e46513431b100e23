"""Python objects through the API: `env=` takes a factory, an env spec or an env class,
`rewards=` takes functions (one or a list, TRL's `fn(prompts, completions, **kw)` too). A run
records each as `module:qualname` where that imports back to the same object, so a fresh
process resumes it; an object no import finds is refused there in one line."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl_cli import api
from agentrl_cli.cli.main import app
from agentrl_cli.envs import ENVS, plugins
from agentrl_cli.envs.base import make_env_spec
from agentrl_cli.errors import ConfigError
from agentrl_cli.rollout import rewards as rewards_module
from conftest import MICRO

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "calculator_env.py"
calc = plugins.load_spec(f"{EXAMPLE}:make")          # the example's factory, from its file
CALC_SPEC = calc(n_ops=1, max_turns=3)
runner = CliRunner()
TRL_CALLS: list[dict] = []
quiet = lambda s: None  # noqa: E731


def make_calc(seed=0, n_ops=1, max_turns=3):
    """A factory of the user's own module (importable: recorded as module:make_calc)."""
    return calc(seed=seed, n_ops=n_ops, max_turns=max_turns)


def short_answer(answer, **kwargs):
    """A per-episode reward function."""
    return -len(answer) / 100


def trl_format(prompts, completions, gold, **kwargs):
    """A TRL-style reward function: batched lists in, a list of floats out."""
    TRL_CALLS.append({"prompts": prompts, "completions": completions, "gold": gold,
                      "keys": sorted(kwargs)})
    return [1.0 if c and c[0]["role"] == "assistant" else 0.0 for c in completions]


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_the_api_trains_with_a_factory_and_reward_functions_and_a_fresh_process_resumes(model_dir, tmp_path):
    TRL_CALLS.clear()
    cfg = api.load_config(method="grpo", env=make_calc, model=model_dir, sets=MICRO,
                          rewards=[short_answer, {"fn": trl_format, "weight": 0.5}])
    run = tmp_path / "run"
    summary = api.train(cfg, run, log=quiet, on_step=lambda s, m: s < 2)
    assert summary["steps"] == 2
    saved = json.loads((run / "config.json").read_text())
    module = make_calc.__module__
    assert saved["env"]["name"] == f"{module}:make_calc"
    assert saved["algo"]["rewards"] == [
        {"name": "short_answer", "fn": f"{module}:short_answer", "weight": 1.0},
        {"name": "trl_format", "fn": f"{module}:trl_format", "weight": 0.5}]
    steps = [r for r in _rows(run) if r["step"] > 0]
    for r in steps:                       # the functions' values are in the trained reward
        assert r["reward/trl_format"] == 1.0
        assert r["reward/mean"] == pytest.approx(
            r["reward/env"] + r["reward/short_answer"] + 0.5 * r["reward/trl_format"])
    call = TRL_CALLS[0]                   # TRL's arguments, a batch of one episode
    assert call["prompts"][0] == [{"role": "user", "content": call["prompts"][0][0]["content"]}]
    assert call["prompts"][0][0]["content"].startswith("Compute ")
    assert call["completions"][0][0]["role"] == "assistant" and len(call["gold"]) == 1
    assert call["keys"] == ["completion_ids", "finish", "reward", "success", "task_id",
                            "tool_calls"]
    # a fresh process finds the factory and the functions by their recorded names
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    res = subprocess.run([sys.executable, "-m", "agentrl_cli.cli.main", "train", "--resume", str(run),
                          "--steps", "3"], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert [r["step"] for r in _rows(run)] == [0, 1, 2, 3]


def test_objects_no_import_finds_run_here_and_are_refused_elsewhere_in_one_line(model_dir, tmp_path, monkeypatch):
    def factory(seed=0, **options):       # a closure: no module:qualname finds it
        return calc(seed=seed, n_ops=1, max_turns=3)

    cfg = api.load_config(method="grpo", env=factory, model=model_dir,
                          sets={**dict(s.split("=") for s in MICRO), "train.steps": 2},
                          rewards=lambda answer, **kw: float(answer == ""))
    assert cfg.env.name.startswith(f"{plugins.OBJECT_PREFIX}:factory")
    assert cfg.algo.rewards[0]["fn"].startswith(f"{plugins.OBJECT_PREFIX}:lambda")
    run = tmp_path / "run"
    assert api.train(cfg, run, log=quiet, on_step=lambda s, m: False)["steps"] == 1
    assert api.resume(run, log=quiet)["steps"] == 2              # this process still has them
    # another process has none of them: one line, exit 2
    monkeypatch.setattr(plugins, "_OBJECTS", {})
    monkeypatch.setattr(ENVS, "_user", {})
    rewards_module._load.cache_clear()
    res = runner.invoke(app, ["train", "--resume", str(run), "--steps", "3"])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "was a Python object given to agentrl_cli.api" in lines[0]
    assert "give it as module:attr or FILE.py:attr" in lines[0]


def test_a_spec_object_and_an_env_class_with_tasks_are_envs(model_dir, tmp_path):
    plain = [s for s in MICRO if not s.startswith("env.")]   # a spec takes no options
    cfg = api.load_config(env=CALC_SPEC, model=model_dir, sets=plain)
    spec = make_env_spec(cfg.env)
    assert spec is CALC_SPEC and spec.tasks("eval", 2) == CALC_SPEC.tasks("eval", 2)
    with pytest.raises(ConfigError, match="has no option 'n_ops'"):
        make_env_spec(api.load_config(env=CALC_SPEC, model=model_dir,
                                      sets=plain + ["env.options={'n_ops': 2}"]).env)
    env_cls = type(CALC_SPEC.make())

    class WithTasks(env_cls):
        def tasks(self, split, n=None):
            return CALC_SPEC.tasks(split, n)

    episodes = api.rollout(tmp_path / "e.jsonl", n=2, env=WithTasks, model=model_dir,
                           sets=MICRO + ["env.max_turns=2"], log=quiet)
    assert len(episodes) == 2 and {e.task_id for e in episodes} <= {
        t.task_id for t in CALC_SPEC.tasks("eval")}
    with pytest.raises(ConfigError, match="is an env class .* without tasks"):
        api.load_config(env=env_cls, model=model_dir, sets=MICRO)


def test_a_file_factory_is_recorded_by_its_file_and_wrong_objects_are_one_line(model_dir):
    cfg = api.load_config(env=calc, model=model_dir, sets=MICRO)
    assert cfg.env.name == f"{EXAMPLE}:make"
    with pytest.raises(ConfigError, match="env expects a name"):
        api.load_config(env=object(), sets=MICRO)
    with pytest.raises(ConfigError, match="is not one a TRL-style reward function gets"):
        api.load_config(sets=MICRO, rewards=lambda prompts, completions, solution: [0.0])


def test_the_python_api_pages_objects_example_runs(model_dir, tmp_path, monkeypatch):
    block = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "python-api.md").read_text(),
                       re.S)[1]
    real = api.load_config

    def micro(config=None, sets=None, *, model=None, **kw):
        given = [f"{k}={v}" for k, v in sets.items()]
        return real(config, MICRO + given, model=model_dir if model == "PATH" else model, **kw)

    monkeypatch.setattr(api, "load_config", micro)
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    monkeypatch.chdir(tmp_path)
    ns = {"__name__": "__main__"}        # as a script runs it
    exec(compile(block, "docs/python-api.md", "exec"), ns)
    saved = json.loads((tmp_path / "runs" / "api-objects" / "config.json").read_text())
    assert ns["summary"]["steps"] == 2 and saved["env"]["name"] == "calculator_env:make"
    assert [r["fn"] for r in saved["algo"]["rewards"]] == [
        f"{plugins.OBJECT_PREFIX}:short", f"{plugins.OBJECT_PREFIX}:calls_calc"]
    rows = _rows(tmp_path / "runs" / "api-objects")
    assert all("reward/calls_calc" in r for r in rows if r["step"] > 0)


def test_callable_objects_are_a_factory_and_a_reward_function(model_dir):
    class Factory:
        def __call__(self, seed=0, n_ops=1):
            return calc(seed=seed, n_ops=n_ops)

    class Scorer:
        def __call__(self, answer, **kwargs):
            return float(answer == "")

    scorer = Scorer()
    plain = [s for s in MICRO if not s.startswith("env.")]
    cfg = api.load_config(env=Factory(), model=model_dir, rewards=scorer,
                          sets=plain + ["env.n_ops=2"])
    assert cfg.env.name.startswith(f"{plugins.OBJECT_PREFIX}:Factory")
    assert make_env_spec(cfg.env).tasks("eval", 1) == calc(n_ops=2).tasks("eval", 1)
    (fn,) = rewards_module.load_rewards(cfg.algo.rewards)
    assert fn.fn is scorer and fn.name.startswith("Scorer")
    assert fn.params == rewards_module.EPISODE_ARGS
