"""Reward functions of the episode (`--reward FILE.py:fn[:WEIGHT]`, `algo.rewards`): parsed and
recorded with absolute paths, applied at every episode's end for every controller (linear
groups, VinePPO continuations, FOCUS leaves), logged as reward/<name>, found again by
--resume from another folder, and a failing function is one line naming it and the task."""
from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from agentrl_cli import config
from agentrl_cli.credit.estimators import SegmentValues
from agentrl_cli.credit.focus_credit import FocusTrees
from agentrl_cli.cli.main import app
from agentrl_cli.engines.base import SamplingParams
from agentrl_cli.engines.hf import HFEngine
from agentrl_cli.errors import ConfigError
from agentrl_cli.rollout.controllers import CONTROLLERS, RolloutContext
from conftest import MICRO, random_value_head, set_args

runner = CliRunner()

REWARDS = '''
import math

def length(episode):
    """Distinct per episode: a tenth of its token count and a hundredth of its actions' length."""
    return 0.1 * len(episode.token_ids) + 0.01 * sum(len(t.action) for t in episode.turns)

def turns(messages, tool_calls, answer, gold, **kwargs):
    return float(sum(m["role"] == "assistant" for m in messages))

def boom(task_id):
    raise ValueError("no luck")

def nan(episode):
    return math.nan
'''


@pytest.fixture()
def reward_file(tmp_path):
    f = tmp_path / "my_rewards.py"
    f.write_text(REWARDS)
    return f


_sets = set_args


def _rows(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_reward_entries_parse_into_names_absolute_paths_and_weights(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = config.load(method="grpo", sets=[
        "algo.rewards=['r.py:length:0.5', 'short=r.py:turns', 'pkg.mod:fn']"])
    assert cfg.algo.rewards == [
        {"name": "length", "fn": f"{tmp_path}/r.py:length", "weight": 0.5},
        {"name": "short", "fn": f"{tmp_path}/r.py:turns", "weight": 1.0},
        {"name": "fn", "fn": "pkg.mod:fn", "weight": 1.0}]
    (tmp_path / "c.yaml").write_text("algo:\n  rewards:\n    - {fn: r.py:length, weight: -2}\n"
                                     "  reward_mode: replace\n")
    cfg = config.load(str(tmp_path / "c.yaml"), method="grpo")
    assert cfg.algo.rewards == [{"name": "length", "fn": f"{tmp_path}/r.py:length", "weight": -2.0}]
    assert cfg.algo.reward_mode == "replace"
    assert config.load(method="grpo").algo.rewards == []


@pytest.mark.parametrize("sets, needle", [
    (["algo.rewards=['a.py:f', 'b.py:f']"], "two reward functions are named 'f'"),
    (["algo.rewards=['mean=a.py:f']"], "'mean' cannot name a reward"),
    (["algo.rewards=[{'fn': 'a.py:f', 'weight': float('nan')}]"], "algo.rewards"),
    (["algo.rewards=[{'fn': 'a.py:f', 'weight': 'x'}]"], "must be a finite number"),
    (["algo.rewards=[{'fn': 'a.py:f', 'scale': 2}]"], "unknown field 'scale'"),
    (["algo.rewards=['nocolon']"], "is not FILE.py:fn or module:fn"),
    (["algo.reward_mode=replace"], "needs at least one reward function"),
])
def test_reward_entry_mistakes_are_one_line(sets, needle):
    with pytest.raises(ConfigError, match=needle):
        config.load(method="grpo", sets=sets)


def test_cli_adds_weighted_rewards_logs_each_and_resume_finds_them(tmp_path, reward_file,
                                                                   monkeypatch):
    monkeypatch.chdir(reward_file.parent)
    run = tmp_path / "run"
    res = runner.invoke(app, ["train", "--method", "grpo", *_sets(["train.steps=2",
                              "train.save_every=1"]), "--reward", "my_rewards.py:length:0.5",
                              "--reward", "my_rewards.py:turns", "--out", str(run)])
    assert res.exit_code == 0, res.output
    rows = [r for r in _rows(run) if r["step"] > 0]
    assert len(rows) == 2
    for r in rows:
        assert r["reward/length"] > 0 and r["reward/turns"] >= 1
        assert r["reward/mean"] == pytest.approx(
            r["reward/env"] + 0.5 * r["reward/length"] + r["reward/turns"], rel=1e-5)
    saved = json.loads((run / "config.json").read_text())["algo"]["rewards"]
    assert [e["fn"] for e in saved] == [f"{reward_file}:length", f"{reward_file}:turns"]
    # resumed from another folder, with more steps: the recorded functions load again
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    res = runner.invoke(app, ["train", "--resume", str(run), "--steps", "3"])
    assert res.exit_code == 0, res.output
    assert "reward/length" in _rows(run)[-1] and _rows(run)[-1]["step"] == 3
    # a resume may not swap the functions
    res = runner.invoke(app, ["train", "--resume", str(run), "--steps", "4", "--reward",
                              f"{reward_file}:turns"])
    assert res.exit_code == 2 and "algo.rewards" in res.output


@pytest.mark.parametrize("fn, needle", [
    ("boom", "raised ValueError: no luck"), ("nan", "returned nan, not a finite number"),
    ("missing", "has no attribute 'missing'")])
def test_a_failing_reward_function_is_one_line_naming_it_and_the_task(tmp_path, reward_file,
                                                                       fn, needle):
    res = runner.invoke(app, ["train", "--method", "grpo", *_sets(["train.steps=1"]),
                              "--reward", f"{reward_file}:{fn}", "--out", str(tmp_path / "r")])
    assert res.exit_code == 2, res.output
    line = res.output.strip().splitlines()[-1]
    assert line.startswith("error: reward ") and needle in line and "Traceback" not in res.output
    if fn != "missing":
        assert f"'{fn}'" in line and "on task search-train-" in line


def _ctx(micro_policy, algo, critic=None, group_size=2):
    model, _, fmt, spec = micro_policy
    return RolloutContext(HFEngine(model, fmt.pad_id), fmt, spec, SamplingParams(max_new_tokens=8),
                          group_size, 512, 8, 0, torch.Generator().manual_seed(0), algo=algo,
                          critic=critic)


def _algo(method, reward_file, mode, **kw):
    sets = [f"algo.rewards=['{reward_file}:length:0.5']", f"algo.reward_mode={mode}"]
    return config.load(method=method, sets=MICRO + sets + [f"algo.{k}={v}" for k, v in kw.items()]).algo


def _expected(ep, mode):
    env = ep.meta.reward_env
    length = 0.1 * len(ep.token_ids) + 0.01 * sum(len(t.action) for t in ep.turns)
    return (env if mode == "add" else 0.0) + 0.5 * length


@pytest.mark.parametrize("mode", ["add", "replace"])
def test_every_controller_credits_the_shaped_reward(micro_policy, reward_file, mode):
    """Linear groups, VinePPO's episodes and the continuations its values average, FOCUS's
    paths and its trees' leaves: each carries env (add) + weight x fn."""
    model, _, _, spec = micro_policy
    tasks = spec.tasks("train", 2)
    lin = CONTROLLERS.get("linear").run(_ctx(micro_policy, _algo("grpo", reward_file, mode)), tasks)
    assert lin.episodes and all(e.reward == pytest.approx(_expected(e, mode)) for e in lin.episodes)

    vine = CONTROLLERS.get("vine").run(_ctx(micro_policy, _algo("vineppo", reward_file, mode,
                                                             vine_k=2)), tasks)
    conts = vine.continuations
    assert conts and all(e.reward == pytest.approx(_expected(e, mode)) for e in conts + vine.episodes)
    values = [v for row in vine.payload.get(SegmentValues).values for v in row if not math.isnan(v)]
    assert values and all(v > 0.5 for v in values)    # means of shaped rewards (>= 0.05 x tokens)

    algo = _algo("focus", reward_file, mode, focus_roots=1)
    foc = CONTROLLERS.get("focus").run(_ctx(micro_policy, algo, random_value_head(model), 4), tasks)
    assert all(e.reward == pytest.approx(_expected(e, mode)) for e in foc.episodes)
    leaves = sorted(t.reward[nodes[-1]] for t in foc.payload.get(FocusTrees).trees
                    for nodes in t.paths.values())
    assert leaves == pytest.approx(sorted(e.reward for e in foc.episodes))
    assert len(set(leaves)) > 1
