"""Env factories declare the options they take (`envs.base.env_factory`): an option no env section
has and the env does not take is a one-line ConfigError naming the env's options; the env
section's options of other envs are dropped; `make_env_spec` builds a spec from a section."""
from __future__ import annotations

import dataclasses

import pytest

from agentrl_cli.config import EnvConfig
from agentrl_cli.errors import ConfigError
from agentrl_cli.envs import ENVS
from agentrl_cli.envs.base import SECTION_OPTIONS, EnvOptionError, env_factory, make_env_spec

BUILT_IN = {"search": {"n_entities", "min_hops", "max_hops", "n_train", "n_eval", "max_turns",
                       "relations", "call_cost"},
            "locate": {"n_files", "n_entities", "min_hops", "max_hops", "n_train", "n_eval",
                       "max_turns", "repos", "call_cost"},
            "math": {"min_hops", "max_hops", "n_train", "n_eval", "max_turns", "call_cost"},
            "rules": {"min_hops", "max_hops", "n_train", "n_eval", "max_turns", "call_cost"},
            "bfcl-multi-turn-base": {"max_turns"}}


def test_every_env_declares_its_options():
    for name in ENVS.names():
        factory = ENVS.get(name)
        assert isinstance(factory.options, tuple) and "seed" not in factory.options, name
    for name, options in BUILT_IN.items():
        assert set(ENVS.get(name).options) == options


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_an_unknown_option_is_one_config_error_line(name):
    with pytest.raises(ConfigError) as e:
        ENVS.get(name)(seed=0, n_entitys=10)
    msg = str(e.value)
    assert "\n" not in msg and f"env '{name}' has no option 'n_entitys'" in msg
    assert all(o in msg for o in BUILT_IN[name])
    assert isinstance(e.value, TypeError)      # what Python raises for an unexpected keyword


def test_the_section_options_of_other_envs_are_dropped():
    seen = {}

    @env_factory("probe", ("max_turns",))
    def probe(seed, **options):
        seen.update(options, seed=seed)
        return options

    probe(seed=3, **{k: getattr(EnvConfig(), k) for k in SECTION_OPTIONS})
    assert seen == {"seed": 3, "max_turns": EnvConfig().max_turns}
    with pytest.raises(EnvOptionError, match="env 'probe' has no option 'bogus'; its options: max_turns"):
        probe(seed=0, bogus=1)


def test_make_env_spec_reads_the_section():
    section = dataclasses.replace(EnvConfig(), name="math", seed=2, max_turns=5, n_train=40,
                                  n_eval=10, relations="single", repos="shared")
    spec = make_env_spec(section)
    assert len(spec.tasks("train")) == 40 and len(spec.tasks("eval")) == 10
    assert spec.make().max_turns == 5
    other = make_env_spec(section, seed=3)
    assert [t.prompt for t in other.tasks("eval")] != [t.prompt for t in spec.tasks("eval")]


@pytest.mark.parametrize("name", ["search", "locate", "math", "rules"])
def test_call_cost_lowers_a_correct_answers_reward_per_message_before_it(name):
    """`env.call_cost` c: the expert's correct answer after k messages earns 1 - c*k (>= 0), a
    wrong answer 0, success unchanged; c = 0 keeps the plain 1/0 reward."""
    import random

    for cost in (0.0, 0.05, 0.6):
        section = dataclasses.replace(EnvConfig(), name=name, n_train=4, n_eval=4, call_cost=cost)
        spec = make_env_spec(section)
        task = spec.tasks("eval")[0]
        env = spec.make()
        env.reset(task)
        rng = random.Random(0)
        while True:
            result = env.step(spec.expert(env, rng, 0.0))
            if result.terminated or result.truncated:
                break
        assert result.info["success"] is True
        assert result.reward == pytest.approx(max(0.0, 1.0 - cost * (env.steps - 1)))
        if cost == 0.6:
            assert env.steps >= 3 and result.reward == 0.0   # 1 - 0.6 * 2 < 0: floored at 0
        env.reset(task)
        wrong = env.step("answer(no such thing at all)")
        assert wrong.reward == 0.0 and wrong.info["success"] is False


def test_call_cost_outside_0_1_is_a_config_error():
    with pytest.raises(ConfigError, match="env.call_cost must be in"):
        make_env_spec(dataclasses.replace(EnvConfig(), call_cost=1.5))
    with pytest.raises(ConfigError, match="env.call_cost must be in"):
        make_env_spec(dataclasses.replace(EnvConfig(), call_cost=-0.1))
