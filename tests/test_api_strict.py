"""The Python API is as strict as the CLI: a wrong type or a value out of the command's bounds
is one `ConfigError` line, raised before any work; so are a wrong method name, a reward's
weight that is no number, `train.warmup_steps >= train.steps`, and an empty YAML section is
no unknown key. Each case fails when its check is removed."""
from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from agentrl_cli import api, config
from agentrl_cli.cli.main import app
from agentrl_cli.errors import ConfigError
from conftest import MICRO

runner = CliRunner()

CASES = [
    ("train(None, out)", lambda out: api.train(None, out), "train: cfg expects the RunConfig"),
    ("train({...})", lambda out: api.train({"train.steps": 1}, out), "got dict"),
    ("evaluate(tasks=-1)", lambda out: api.evaluate(model="tiny", tasks=-1),
     "evaluate: tasks must be an integer >= 1, got int -1"),
    ("evaluate(n=0)", lambda out: api.evaluate(model="tiny", n=0), "evaluate: n must be"),
    ("evaluate(pass_k=2.0)", lambda out: api.evaluate(model="tiny", pass_k=2.0), "got float 2.0"),
    ("evaluate(greedy='yes')", lambda out: api.evaluate(model="tiny", greedy="yes"),
     "greedy expects True or False"),
    ("rollout(n=0)", lambda out: api.rollout(out / "e.jsonl", n=0, policy="expert"),
     "rollout: n must be an integer >= 1, got int 0"),
    ("rollout(n=True)", lambda out: api.rollout(out / "e.jsonl", n=True), "got bool True"),
    ("rollout(group_size=0)", lambda out: api.rollout(out / "e.jsonl", group_size=0),
     "group_size must be"),
    ("rollout(split='dev')", lambda out: api.rollout(out / "e.jsonl", split="dev"),
     "split must be train or eval"),
    ("rollout(policy='human')", lambda out: api.rollout(out / "e.jsonl", policy="human"),
     "policy must be model or expert"),
    ("rollout(None)", lambda out: api.rollout(None), "out expects a JSONL file's path"),
    ("sets=5", lambda out: api.load_config(sets=5), "sets expects a mapping"),
    ("sets=[1]", lambda out: api.load_config(sets=[1]), "sets expects a mapping"),
    ("sets={k: object}", lambda out: api.load_config(sets={"env.name": print}),
     "sets['env.name'] is a builtin_function_or_method"),
    ("rewards=5", lambda out: api.load_config(rewards=5), "rewards takes functions"),
    ("rewards weight", lambda out: api.load_config(rewards={"fn": print, "weight": "x"}),
     "expects a number"),
    ("env=5", lambda out: api.load_config(env=5), "env expects a name"),
    ("method=3", lambda out: api.load_config(method=3), "method expects a string, got int 3"),
    ("seed=-1", lambda out: api.load_config(seed=-1), "seed must be an integer >= 0"),
    ("config=1", lambda out: api.load_config(1), "config expects a YAML file's path"),
    ("method name", lambda out: api.load_config(method="grpoo"), "did you mean 'grpo'"),
    ("resume(steps=0)", lambda out: api.resume(out, steps=0), "resume: steps must be"),
    ("resume(None)", lambda out: api.resume(None), "resume: run expects"),
    ("on_step=1", lambda out: api.train(api.load_config(sets=MICRO), out, on_step=1),
     "on_step expects a function"),
    ("warm-up", lambda out: api.load_config(sets={"train.warmup_steps": 5, "train.steps": 5}),
     "train.warmup_steps (5) must be < train.steps (5)"),
    ("reward weight", lambda out: api.load_config(rewards="f.py:fn:abc"),
     "the weight 'abc' of 'f.py:fn:abc' is not a number"),
]


@pytest.mark.parametrize("fn,needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_api_mistake_is_one_configerror_line_before_any_work(fn, needle, tmp_path):
    with pytest.raises(ConfigError) as e:
        fn(tmp_path / "run")
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()        # nothing started


def test_a_config_changed_past_its_checks_is_checked_again_by_train(tmp_path):
    cfg = api.load_config(sets=MICRO)
    bad = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=-1))
    with pytest.raises(ConfigError, match="train.steps must be >= 0"):
        api.train(bad, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_one_reward_string_is_one_reward_not_its_letters(tmp_path):
    (tmp_path / "f.py").write_text("def fn(**kw):\n    return 0.0\n")
    cfg = api.load_config(sets=MICRO, rewards=f"{tmp_path}/f.py:fn:0.5")
    assert cfg.algo.rewards == [{"name": "fn", "fn": f"{tmp_path}/f.py:fn", "weight": 0.5}]
    assert api.load_config(sets="train.steps=3").train.steps == 3     # one --set string


def test_cli_reward_weight_that_is_no_number_and_warmup_past_the_run(tmp_path):
    (tmp_path / "f.py").write_text("def fn(**kw):\n    return 0.0\n")
    res = runner.invoke(app, ["train", "--reward", f"{tmp_path}/f.py:fn:abc",
                              "--out", str(tmp_path / "run")])
    assert res.exit_code == 2 and "no module named" not in res.output
    assert f"the weight 'abc' of '{tmp_path}/f.py:fn:abc' is not a number" in res.output
    res = runner.invoke(app, ["train", "--steps", "4", "--set", "train.warmup_steps=6",
                              "--out", str(tmp_path / "run")])
    assert res.exit_code == 2 and "train.warmup_steps (6) must be < train.steps (4)" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_a_yaml_section_left_empty_sets_nothing_and_a_scalar_section_is_one_line(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("train:\nrollout:\n  group_size: 3\n")
    cfg = config.load(str(f))
    assert cfg.rollout.group_size == 3 and cfg.train == config.load().train
    f.write_text("train: 5\n")
    with pytest.raises(ConfigError, match="'train' is a config section: give its keys under it"):
        config.load(str(f))
    res = runner.invoke(app, ["train", "--config", str(f), "--out", str(tmp_path / "run")])
    assert res.exit_code == 2 and "unknown config key" not in res.output


def test_a_step_callback_that_exits_is_one_line_naming_it(tmp_path):
    """`sys.exit` inside `on_step` would end the user's program with nothing said; it is one
    ConfigError line naming the callback, its file and the step."""
    import sys

    def leave(step, metrics):
        sys.exit(0)

    with pytest.raises(ConfigError) as e:
        api.train(api.load_config(sets=[*MICRO, "train.steps=2"]), tmp_path / "run", on_step=leave,
                  log=lambda s: None)
    msg = str(e.value)
    assert "\n" not in msg and "the step callback" in msg and "leave" in msg
    assert f"test_api_strict.py:{leave.__code__.co_firstlineno}" in msg and "at step 1" in msg
    assert "user code must not end the process" in msg


@pytest.mark.parametrize("body, needle", [
    ("raise ValueError('bad row')", "raised ValueError: bad row"),
    ("time.sleep(30)", "did not return within 0.5 s (train.on_step_timeout_s"),
])
def test_a_failing_or_hung_step_callback_is_one_line_naming_it(tmp_path, body, needle):
    """The step callback runs under the guard all user code runs under: an exception or a
    callback past `train.on_step_timeout_s` stops the run with one line naming the callback,
    its file and the step, not a traceback from inside the trainer or a hang."""
    import time  # noqa: F401  (the hung callback's body uses it)

    src = f"def cb(step, metrics):\n    {body}\n"
    scope = {"time": time}
    exec(compile(src, str(tmp_path / "callback.py"), "exec"), scope)
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        api.train(api.load_config(sets=[*MICRO, "train.steps=2", "train.on_step_timeout_s=0.5"]),
                  tmp_path / "run", on_step=scope["cb"], log=lambda s: None)
    msg = str(e.value)
    assert "\n" not in msg and "the step callback cb at step 1" in msg, msg
    assert "callback.py:1" in msg and needle in msg, msg
    assert time.monotonic() - t0 < 25           # the hung one did not hold the run for 30 s
