"""reasoning-gym's generators as envs (`reasoning-gym:NAME`): tasks, options, scoring, the expert,
check-env and training from the CLI and the Python API, on the real reasoning-gym package."""
from __future__ import annotations

import json
import pickle
import random

import pytest
from typer.testing import CliRunner

from agentrl_cli.cli.main import app
from agentrl_cli.config import EnvConfig
from agentrl_cli.envs import ENVS
from agentrl_cli.envs import rgym as R
from agentrl_cli.envs.base import make_env_spec
from agentrl_cli.errors import ConfigError

from conftest import MICRO
from env_checks import check_malformed, run_expert

runner = CliRunner()
CHAIN = {"min_terms": 3, "max_terms": 4, "max_digits": 2}


def spec_of(name: str, n_train: int = 120, n_eval: int = 30, seed: int = 0, **options):
    # as the config loader records them: the env keys a user gives are the scheme env's options
    return make_env_spec(EnvConfig(name=f"reasoning-gym:{name}", seed=seed,
                                   options={"n_train": n_train, "n_eval": n_eval, **options}))


@pytest.fixture(scope="module")
def chain():
    return spec_of("chain_sum", **CHAIN)


def test_a_scheme_name_resolves_to_reasoning_gym(chain):
    assert isinstance(chain, R.ReasoningGymSpec) and chain.name == "reasoning-gym:chain_sum"
    assert "reasoning-gym" in ENVS.schemes
    assert chain.calculator and "calc(expression)" in chain.system_prompt
    assert not spec_of("spell_backward").calculator          # not arithmetic: answer only


def test_splits_are_seeded_disjoint_and_from_the_generator(chain):
    train, ev = chain.tasks("train"), chain.tasks("eval")
    assert len(train) == 120 and len(ev) == 30 and chain.tasks("eval", 4) == ev[:4]
    assert not {t.prompt for t in train} & {t.prompt for t in ev}
    again = spec_of("chain_sum", **CHAIN)
    assert [t.prompt for t in again.tasks("eval")] == [t.prompt for t in ev]
    other_seed = spec_of("chain_sum", seed=1, **CHAIN)
    assert [t.prompt for t in other_seed.tasks("eval")] != [t.prompt for t in ev]
    for t in train[:20]:   # the generator's options reached it: 3-4 terms of 1-2 digits
        terms = t.meta["entry"]["metadata"]["expression"].split()[::2]
        assert 3 <= len(terms) <= 4 and all(len(x) <= 2 for x in terms)
    with pytest.raises(ConfigError, match="unknown split"):
        chain.tasks("test")


def test_a_mix_takes_tasks_in_turn_and_routes_options():
    mix = spec_of("chain_sum,leg_counting", max_terms=3, leg_counting={"max_animals": 3})
    gens = [t.meta["generator"] for t in mix.tasks("train", 6)]
    assert gens == ["chain_sum", "leg_counting"] * 3
    for t in mix.tasks("train"):
        meta = t.meta["entry"]["metadata"]
        if t.meta["generator"] == "leg_counting":
            assert len(meta["animals"]) <= 3
        else:
            assert len(meta["expression"].split()[::2]) <= 3


@pytest.mark.parametrize("name, options, message", [
    ("chain_sum", {"max_termz": 3}, "has no option 'max_termz'"),
    ("chain_sum", {"max_terms": 1, "min_terms": 2}, "reasoning-gym refuses its options"),
    ("chain_summ", {}, "no generator 'chain_summ' (did you mean 'chain_sum'?)"),
    ("chain_sum", {"chain_sum": 3}, "takes a mapping"),
    ("chain_sum", {"calculator": "maybe"}, "calculator is true, false or auto"),
])
def test_bad_names_and_options_are_one_line(name, options, message):
    with pytest.raises(ConfigError, match=".*".join(map(__import__("re").escape, message.split("*")))) as e:
        spec_of(name, **options).tasks("train")
    assert "\n" not in str(e.value)


def test_reward_is_reasoning_gyms_score(chain):
    env = chain.make()
    task = chain.tasks("eval")[0]
    env.reset(task)
    r = env.step(f"answer({task.answer})")
    assert r.terminated and r.reward == 1.0 and r.info["success"] and r.info["score"] == 1.0
    env.reset(task)
    r = env.step(f"answer(the answer is {task.answer})")     # reasoning-gym's partial credit
    expected = len(task.answer) / len(f"the answer is {task.answer}")
    assert r.reward == pytest.approx(expected) and 0 < r.reward < 1 and not r.info["success"]
    env.reset(task)
    r = env.step("answer(no idea)")
    assert r.reward == 0.0 and not r.info["success"]
    env.reset(task)
    assert env.step("calc(12+30)").observation == "42"
    assert env.step("calc(1/0)").info["error"]


@pytest.mark.parametrize("action", ["", "hello", "calc(1", "calc(1) calc(2)",
                                    "answer(5) answer(6)", "calc(1\n+2)", "look(1)"])
def test_malformed_messages(chain, action):
    check_malformed(chain, action, chain.malformed)


def test_an_answer_may_span_lines_and_answer_only_envs_refuse_calc():
    spec = spec_of("spell_backward")
    env = spec.make()
    env.reset(spec.tasks("eval")[0])
    assert env.step("calc(1+1)").observation == spec.malformed == "error: use answer(...)"
    env.reset(spec.tasks("eval")[0])
    assert env.step("answer(a\nb)").terminated


@pytest.mark.parametrize("name, options", [("chain_sum", CHAIN),
                                           ("leg_counting", {"max_animals": 3}),
                                           ("spell_backward", {})])
def test_the_expert_solves_every_held_out_task(name, options):
    spec = spec_of(name, **options)
    rng = random.Random(0)
    for task in spec.tasks("eval"):
        actions, results = run_expert(spec, spec.make(), task, rng)
        assert results[-1].reward == 1.0, (task.prompt, actions)
        calcs = [a for a in actions if a.startswith("calc(")]
        plan = R.expert_plan(name, task.meta["entry"])
        assert len(calcs) == (len(plan) if plan else 0)   # one calc a step where it has steps


def test_the_imperfect_expert_slips_in_reasoning(chain):
    rng = random.Random(1)
    finals = [run_expert(chain, chain.make(), t, rng, error_rate=0.3)[1][-1].reward
              for t in chain.tasks("train", 100)]
    rate = sum(finals) / len(finals)
    assert 0.2 < rate < 0.8        # about 0.7^steps: slips happen and are not copied into success


def test_snapshot_restore_is_independent(chain):
    env = chain.make()
    task = chain.tasks("eval")[1]
    env.reset(task)
    rng = random.Random(0)
    env.step(chain.expert(env, rng))
    snap = env.snapshot()
    blob = pickle.dumps(snap)
    end = run_expert(chain, env, None, random.Random(2))[1][-1]
    assert end.reward == 1.0
    env.restore(snap)
    assert env.steps == 1 and not env.done and pickle.dumps(snap) == blob
    assert env.step("answer(no)").reward == 0.0


def test_check_env_passes_a_reasoning_gym_env():
    res = runner.invoke(app, ["check-env", "reasoning-gym:chain_sum",
                              "--set", "env.options.max_terms=3", "--set", "env.n_train=50"])
    assert res.exit_code == 0, res.output


def test_unknown_generator_from_the_cli_is_one_line():
    res = runner.invoke(app, ["check-env", "reasoning-gym:no_such_task"])
    assert res.exit_code == 2 and "no generator 'no_such_task'" in res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("method", ["grpo", "focus"])
def test_training_steps_from_the_cli(method, tmp_path):
    out = tmp_path / method
    res = runner.invoke(app, ["train", "--method", method, "--env", "reasoning-gym:chain_sum",
                              "--out", str(out), "--set", "train.steps=2",
                              "--set", "env.max_terms=3", "--set", "env.n_train=40",
                              *[a for s in MICRO for a in ("--set", s)]])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["step"] > 0] == [1, 2]
    saved = json.loads((out / "config.json").read_text())["env"]
    # as for a user env, the env keys given are recorded as its options
    assert saved["name"] == "reasoning-gym:chain_sum"
    assert saved["options"] == {"max_terms": 3, "n_train": 40, "max_turns": 3}


def test_training_from_the_python_api(tmp_path):
    from agentrl_cli import api

    cfg = api.load_config(method="grpo", env="reasoning-gym:leg_counting",
                          sets=[*MICRO, "train.steps=1", "env.n_train=30",
                                "env.options.min_animals=2", "env.options.max_animals=2"])
    summary = api.train(cfg, tmp_path / "run")
    assert (tmp_path / "run" / "metrics.jsonl").exists() and summary is not None


@pytest.mark.parametrize("name", ["chain-sum", "leg-counting"])
def test_the_example_cpu_files_load_their_worlds(name):
    """The CPU files of the results page's reasoning-gym table load, and their generator options
    reach the world (3-4 terms of 1-2 digits; 2-3 kinds of animals)."""
    from pathlib import Path

    from agentrl_cli import config

    path = Path(__file__).resolve().parents[1] / "examples" / "reasoning-gym" / f"{name}-cpu.yaml"
    cfg = config.load(str(path), sets=["env.n_train=50"])
    spec = make_env_spec(cfg.env)
    assert spec.name == f"reasoning-gym:{name.replace('-', '_')}" and len(spec.tasks("train")) == 50
    meta = spec.tasks("train")[0].meta["entry"]["metadata"]
    if name == "chain-sum":
        assert 3 <= len(meta["expression"].split()[::2]) <= 4
    else:
        assert 2 <= len(meta["animals"]) <= 3


def test_without_reasoning_gym_installed_the_env_is_one_line(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "reasoning_gym", None)     # as if not installed
    R._rg.cache_clear()
    try:
        with pytest.raises(ConfigError, match="needs reasoning-gym: pip install reasoning-gym"):
            spec_of("chain_sum")
    finally:
        R._rg.cache_clear()
