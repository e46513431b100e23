"""A researcher's own env, without touching the package: `--env file.py:factory`,
`module:factory`, its options, `agentrl check-env`, the fork check FOCUS needs, training and
resuming on it, and the zero-spread metric that says when a run cannot learn."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from agentrl_cli import config
from agentrl_cli.errors import ConfigError
from agentrl_cli.cli.main import app
from agentrl_cli.envs.base import make_env_spec
from agentrl_cli.envs.checker import check_env
from conftest import MICRO

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "calculator_env.py"
runner = CliRunner()

# a fork that does not restore: `restore` keeps the fresh env's (empty) state
BROKEN = f'''
import importlib.util
_s = importlib.util.spec_from_file_location("calc_for_broken", {str(EXAMPLE)!r})
calc = importlib.util.module_from_spec(_s)
_s.loader.exec_module(calc)


class NoRestore(calc.CalculatorEnv):
    def restore(self, state):
        pass


class Spec(calc.CalculatorSpec):
    def make(self):
        return NoRestore(self.max_turns)


def make(seed=0, **options):
    return Spec(seed, **options)


def returns_int(seed=0):
    return 3
'''


def _sets(extra=()):
    out = []
    for s in [*MICRO, "env.n_ops=1", *extra]:
        out += ["--set", s]
    return out


def _one_line_error(res, needle):
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], res.output


@pytest.fixture
def broken(tmp_path):
    f = tmp_path / "broken_env.py"
    f.write_text(BROKEN)
    return f


def test_the_example_passes_check_env():
    res = runner.invoke(app, ["check-env", f"{EXAMPLE}:make"])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("ok: env ")    # stderr: each check as it starts
    assert "200 train / 50 eval tasks with gold answers" in res.output
    assert "scripted expert: none" in res.output


KEYDOOR = ROOT / "examples" / "keydoor_env.py"


def test_the_keydoor_example_has_an_expert_that_gets_out_where_random_play_rarely_does():
    """The example with a scripted expert (docs/your-env.md, "A starting agent from your
    expert"): it passes check-env, its expert always gets out, a random player seldom does, and
    the exit opens only with the lock's key."""
    import importlib.util
    import random

    res = runner.invoke(app, ["check-env", f"{KEYDOOR}:make"])
    assert res.exit_code == 0, res.output
    assert "scripted expert: yes" in res.output
    s = importlib.util.spec_from_file_location("keydoor_for_test", KEYDOOR)
    kd = importlib.util.module_from_spec(s)
    s.loader.exec_module(kd)
    spec = kd.make()

    def success(error_rate):
        rng, wins = random.Random(0), 0
        for task in spec.tasks("eval"):
            env = spec.make()
            env.reset(task)
            while not env.done:
                r = env.step(spec.expert(env, rng, error_rate))
            wins += r.reward
        return wins / len(spec.tasks("eval"))

    assert success(0.0) == 1.0
    assert success(1.0) < 0.3
    env = spec.make()
    env.reset(spec.tasks("train")[0])
    exit_door = len(env.doors())
    r = env.step(f"go({exit_door})")
    assert r.reward == 0.0 and "locked" in r.observation and not env.done
    assert env.step("open the door").info["error"]


def test_a_broken_fork_fails_check_env_and_focus_refuses_it(broken, model_dir, tmp_path):
    res = runner.invoke(app, ["check-env", f"{broken}:make"])
    assert res.exit_code == 2, res.output
    assert res.stdout.splitlines()[0].startswith(
        "fork: a fresh env restored from snapshot() diverged from the original"), res.output
    report = check_env(lambda s: make_env_spec(config.load(**{"env.name": f"{broken}:make"}).env, s))
    assert [p.split(":")[0] for p in report.problems] == ["fork"]
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--method", "focus", "--env", f"{broken}:make",
                              "--model", model_dir, "--out", str(out), *_sets()])
    _one_line_error(res, "method focus forks episodes (snapshot/restore), and env ")
    assert "fails the fork check: fork: a fresh env restored" in res.output
    assert not out.exists()               # refused before the run folder or any model
    from agentrl_cli.app.train import train

    cfg = config.load(method="vineppo", sets=[*MICRO, f"model.name={model_dir}"],
                      **{"env.name": f"{broken}:make"})
    with pytest.raises(ConfigError, match="method vineppo forks episodes"):
        train(cfg, out)
    assert not out.exists()


def test_rollout_of_the_example_env(model_dir, tmp_path):
    res = runner.invoke(app, ["rollout", "--env", f"{EXAMPLE}:make", "--model", model_dir,
                              "--n", "4", "--out", str(tmp_path / "eps.jsonl"), *_sets()])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (tmp_path / "eps.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    assert "Compute " in json.dumps(rows[0])


def test_a_user_env_without_an_expert_refuses_model_tiny():
    res = runner.invoke(app, ["train", "--env", f"{EXAMPLE}:make", "--set", "train.steps=1"])
    _one_line_error(res, "has no scripted expert")
    assert "--model PATH" in res.output


def test_an_expert_rollout_of_an_env_without_an_expert_is_one_line(model_dir, tmp_path):
    res = runner.invoke(app, ["rollout", "--env", f"{EXAMPLE}:make", "--policy", "expert",
                              "--model", model_dir, "--n", "2", "--out", str(tmp_path / "eps.jsonl")])
    _one_line_error(res, "has no scripted expert")
    assert "--policy model" in res.output and not (tmp_path / "eps.jsonl").exists()


@pytest.mark.parametrize("method", ["grpo", "focus"])
def test_training_steps_on_the_example_env(method, model_dir, tmp_path):
    out = tmp_path / method
    res = runner.invoke(app, ["train", "--method", method, "--env", f"{EXAMPLE}:make",
                              "--model", model_dir, "--out", str(out),
                              *_sets(["train.steps=3"])])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(0.0 <= r["rollout/zero_spread_groups"] <= 1.0 for r in steps)
    saved = json.loads((out / "config.json").read_text())["env"]
    assert saved["name"] == f"{EXAMPLE}:make" and saved["options"] == {"n_ops": 1, "max_turns": 3}
    # the untrained model never answers right: no group has reward spread, and the log says so
    if method == "grpo":
        assert all(r["rollout/zero_spread_groups"] == 1.0 for r in steps)
    if all(r["rollout/zero_spread_groups"] == 1.0 for r in steps):
        assert res.output.count("no reward spread in any group") == 1, res.output


def test_module_factory_and_its_options(tmp_path, monkeypatch):
    shutil.copy(EXAMPLE, tmp_path / "mycalc_env.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = config.load(sets=["env.n_ops=3", "env.max_operand=9"], **{"env.name": "mycalc_env:make"})
    assert cfg.env.options == {"n_ops": 3, "max_operand": 9}
    spec = make_env_spec(cfg.env)
    # the options given reach the factory; the others keep the factory's own defaults (n_eval
    # 50, max_turns 6), not the env section's (60, 12)
    assert all(t.prompt.count(" ") == 7 for t in spec.tasks("eval"))   # 3 operations
    assert len(spec.tasks("eval")) == 50 and spec.make().max_turns == 6
    res = runner.invoke(app, ["check-env", "mycalc_env:make", "--set", "env.n_ops=1"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["check-env", "mycalc_env:make", "--set", "env.n_opz=1"])
    _one_line_error(res, "env 'mycalc_env:make' has no option 'n_opz'; its options: n_train, "
                         "n_eval, n_ops, max_operand, max_turns")
    # a subprocess finds the module through PYTHONPATH
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    p = subprocess.run([sys.executable, "-m", "agentrl_cli.cli.main", "check-env",
                        "mycalc_env:make", "--set", "env.options.n_ops=1"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert p.returncode == 0 and p.stdout.startswith("ok: env 'mycalc_env:make'"), p.stderr


@pytest.mark.parametrize("spec, needle", [
    ("{tmp}/missing.py:make", "file {tmp}/missing.py does not exist"),
    ("{broken}:mkae", "has no attribute 'mkae' (did you mean 'make'?)"),
    ("{broken}:returns_int", "its factory returned a value of type int, not an env spec"),
    ("no_such_module_xyz:make", "no module named 'no_such_module_xyz'"),
    ("{bad_syntax}:make", "does not import: SyntaxError"),
])
def test_bad_specs_are_one_line_exit_2(spec, needle, broken, tmp_path):
    bad = tmp_path / "bad_syntax.py"
    bad.write_text("def make(:\n")
    fill = {"tmp": tmp_path, "broken": broken, "bad_syntax": bad}
    for cmd in (["check-env", spec.format(**fill)],
                ["rollout", "--env", spec.format(**fill), "--out", str(tmp_path / "e.jsonl")]):
        res = runner.invoke(app, cmd)
        _one_line_error(res, needle.format(**fill))


def test_resume_finds_a_file_env_again(model_dir, tmp_path, monkeypatch):
    """A run on `--env examples/...py:make` (a relative path) records the file's absolute
    path, so a resume from another folder finds the env."""
    monkeypatch.chdir(ROOT)
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--method", "grpo", "--env",
                              "examples/calculator_env.py:make", "--model", model_dir,
                              "--out", str(out), *_sets(["train.steps=1"])])
    assert res.exit_code == 0, res.output
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["train", "--resume", str(out), "--steps", "2"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    res = runner.invoke(app, ["eval", "--checkpoint", str(out), "--n", "1", "--tasks", "2",
                              "--json", str(tmp_path / "eval.json")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "eval.json").read_text())


def test_zero_spread_groups_and_the_warning():
    from agentrl_cli.train.loop import zero_spread_groups, warn_no_spread

    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    assert zero_spread_groups(rewards, groups) == pytest.approx(2 / 3)
    assert zero_spread_groups(torch.zeros(4), torch.tensor([0, 0, 1, 1])) == 1.0
    assert zero_spread_groups(torch.tensor([0.0, 1.0]), torch.tensor([0, 0])) == 0.0

    class FakeRun:
        spread_seen = False

        def __init__(self):
            self.lines = []
            self.log = self.lines.append

    flat = {"rollout/zero_spread_groups": 1.0, "reward/mean": 0.0}
    run = FakeRun()
    for step in (1, 2, 3, 4, 5):
        warn_no_spread(run, step, flat)
    assert len(run.lines) == 1 and run.lines[0].startswith(
        "warning: no reward spread in any group: in steps 1-3")
    run = FakeRun()                       # one step with spread: no warning
    for step, share in ((1, 1.0), (2, 0.5), (3, 1.0)):
        warn_no_spread(run, step, {**flat, "rollout/zero_spread_groups": share})
    assert run.lines == []


def test_ray_workers_import_a_module_env_as_the_trainer_did(model_dir, tmp_path, monkeypatch):
    """The module is importable only through the trainer's `sys.path` (not PYTHONPATH): a Ray
    rollout worker gets that path and builds the same env."""
    pytest.importorskip("ray")
    shutil.copy(EXAMPLE, tmp_path / "raycalc_env.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--method", "grpo", "--env", "raycalc_env:make",
                              "--model", model_dir, "--out", str(out), "--rollout-workers", "1",
                              *_sets(["train.steps=1"])])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and rows[1]["rollout/tokens"] > 0


def test_an_installed_packages_entry_point_env(tmp_path, monkeypatch):
    """A package's `agentrl.envs` entry point is an env name like a built-in one, options
    included."""
    from agentrl_cli.envs import plugins

    shutil.copy(EXAMPLE, tmp_path / "epcalc_env.py")
    info = tmp_path / "epcalc-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: epcalc\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[agentrl.envs]\nep-calculator = epcalc_env:make\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins.entry_points.cache_clear()
    try:
        cfg = config.load(sets=["env.n_ops=3"], **{"env.name": "ep-calculator"})
        assert cfg.env.options == {"n_ops": 3}
        assert all(t.prompt.count(" ") == 7 for t in make_env_spec(cfg.env).tasks("eval"))
        res = runner.invoke(app, ["check-env", "ep-calculator"])
        assert res.exit_code == 0 and res.stdout.startswith("ok: env 'ep-calculator'"), res.output
    finally:
        plugins.entry_points.cache_clear()


def test_an_expert_rollout_builds_no_model(tmp_path, monkeypatch):
    """The expert needs no model: on an env whose tiny agent is not built, `rollout --policy
    expert` records byte-level token ids at once and says so, and nothing is built."""
    import agentrl_cli.app.rollout as ar          # the name `agentrl rollout` calls
    from agentrl_cli.models.loading import tiny_recipe
    from agentrl_cli.models.tiny import is_built, tiny_path

    monkeypatch.setattr(ar, "ensure_model", lambda *a, **k: pytest.fail("a model was built"))
    # a world no agent ships for (`--env locate` alone loads the shipped locate agent)
    cfg = config.load(sets=["env.name=locate", "env.n_train=600", "env.max_turns=8"])
    assert not is_built(tiny_path(tiny_recipe(cfg)))
    out = tmp_path / "e.jsonl"
    res = runner.invoke(app, ["rollout", "--env", "locate", "--set", "env.n_train=600",
                              "--policy", "expert", "--n", "8", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "byte-level" in res.output and "no model is built" in res.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 8 and all(r["token_ids"] for r in rows)
    # rollout.max_tokens (a model's context) does not cut byte-level episodes: the expert's
    # locate episodes run past it in bytes and all succeed
    assert max(len(r["token_ids"]) for r in rows) > cfg.rollout.max_tokens
    assert all(r["success"] for r in rows)
    assert not is_built(tiny_path(tiny_recipe(cfg)))
