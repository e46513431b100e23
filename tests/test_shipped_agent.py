"""The tiny agent that ships with the package: it is the build of the recipe in code, the main
command loads it without building, and `agentrl build-tiny` remakes a recipe from scratch."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl_cli.cli.main import app
from agentrl_cli.app.preflight import load_config
from agentrl_cli.models import tiny
from agentrl_cli.models.loading import tiny_recipe

from conftest import MICRO

ROOT = Path(__file__).resolve().parents[1]
# shipped folder -> (--benchmark, --config) of the recipe it is the build of
SHIPPED = {"search": (None, None), "search-long": ("search-long", None),
           "allocation-early": ("allocation-early", None),
           "allocation-late": ("allocation-late", None),
           "math": (None, ROOT / "experiments" / "focus-math-cpu.yaml"),
           "rules": (None, ROOT / "experiments" / "focus-deonticbench-cpu.yaml"),
           "locate": (None, ROOT / "experiments" / "focus-locbench-cpu.yaml")}


def test_a_call_cost_loads_the_same_build():
    """env.call_cost is a reward setting: the warm-up (expert imitation) and so the build are
    the same, e.g. the compaction variant of the long horizon loads the shipped long agent."""
    recipe = tiny_recipe(load_config(None, None, "search-long-compaction"))
    assert recipe.env.call_cost == 0.0 and "call_cost" not in recipe.flat()
    assert recipe.key() == tiny_recipe(load_config(None, None, "search-long")).key()
    assert tiny.shipped_path(recipe) == tiny.SHIPPED / "search-long"
    assert load_config(None, None, "search-long-compaction").env.call_cost == 0.05


@pytest.mark.parametrize("folder", sorted(SHIPPED))
def test_the_shipped_build_is_the_recipe_in_code(folder):
    benchmark, config = SHIPPED[folder]
    recipe = tiny_recipe(load_config(config, None, benchmark))
    shipped = json.loads((tiny.SHIPPED / folder / "recipe.json").read_text())
    # every field by name, so a changed default says which one differs (then rebuild and ship:
    # agentrl build-tiny [--benchmark B | --config C] --out agentrl_cli/models/shipped/<folder>)
    assert shipped["recipe"] == recipe.flat()
    assert shipped["key"] == recipe.key()
    # the env shows the world the build was made for (its expert's first episodes hash the same)
    from agentrl_cli.app.tiny_build import world_fingerprint
    assert shipped["world"] == world_fingerprint(recipe)
    assert tiny.shipped_path(recipe) == tiny.SHIPPED / folder
    files = {p.name for p in (tiny.SHIPPED / folder).iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", tiny.VALUE_HEAD,
            "recipe.json"} <= files
    size = sum(p.stat().st_size for p in (tiny.SHIPPED / folder).iterdir())
    assert size < 4 * 2**20, size


def test_an_env_format_change_gives_its_builds_a_new_key(monkeypatch):
    """A built-in env whose observations changed (tiny.ENV_FORMATS) changes the key of its
    recipes only: its old builds are neither shipped nor cached for the new world."""
    locate = tiny_recipe(load_config(SHIPPED["locate"][1], None))
    search = tiny_recipe(load_config(None, None))
    keys = locate.key(), search.key()
    monkeypatch.setitem(tiny.ENV_FORMATS, "locate", tiny.ENV_FORMATS["locate"] + 1)
    assert locate.key() != keys[0] and search.key() == keys[1]
    assert tiny.shipped_path(locate) is None


def test_the_main_command_loads_the_shipped_build_without_building(tmp_path, monkeypatch):
    from agentrl_cli.app.tiny_build import load_policy

    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    logs = []
    cfg = load_config(None, None)
    model, tok, fmt, path = load_policy(cfg, log=logs.append)
    assert path == str(tiny.SHIPPED / "search") and not logs
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    assert sum(p.numel() for p in model.parameters()) == json.loads(
        (tiny.SHIPPED / "search" / "recipe.json").read_text())["params"]
    # another recipe is not shipped: it goes to the cache
    other = tiny_recipe(load_config(None, MICRO))
    assert tiny.shipped_path(other) is None
    assert tiny.tiny_path(other) == tiny.cache_path(other)
    assert str(tiny.cache_path(other)).startswith(str(tmp_path / "cache"))


def test_build_tiny_remakes_a_recipe_and_compares_it_with_the_shipped_build(tmp_path, monkeypatch):
    runner = CliRunner()
    sets = [a for s in MICRO for a in ("--set", s)]
    first = tmp_path / "first"
    r = runner.invoke(app, ["build-tiny", "--out", str(first), *sets])
    assert r.exit_code == 0, r.output
    assert "no build of this recipe ships with the package" in r.output
    assert (first / "recipe.json").is_file() and (first / "model.safetensors").is_file()
    # a non-empty --out is refused with one line, before any work
    r = runner.invoke(app, ["build-tiny", "--out", str(first), *sets])
    assert r.exit_code == 2 and "not empty" in r.output
    # with the first build as the package's, a second build of the same recipe is compared to
    # it: the same machine and thread count give the same weights, byte for byte
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    os.rename(first, shipped / "micro")
    monkeypatch.setattr(tiny, "SHIPPED", shipped)
    r = runner.invoke(app, ["build-tiny", "--out", str(tmp_path / "second"), *sets])
    assert r.exit_code == 0, r.output
    assert "the package ships this recipe's build" in r.output
    assert "the same weights as the shipped build, byte for byte" in r.output
    # and a different build (here: the weights altered) is reported as different
    from agentrl_cli.app.tiny_build import rebuild

    data = bytearray((shipped / "micro" / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (shipped / "micro" / "model.safetensors").write_bytes(bytes(data))
    info = rebuild(tiny_recipe(load_config(None, MICRO)), tmp_path / "third", log=lambda s: None)
    assert info["shipped"] == str(shipped / "micro") and info["identical"] is False


def test_the_cache_folder_of_a_user_env_is_one_folder(tmp_path, monkeypatch):
    from agentrl_cli.config import EnvConfig

    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    recipe = tiny.TinyRecipe(env=EnvConfig(name="/home/me/envs/my env.py:make"))
    path = tiny.cache_path(recipe)
    assert path.parent == tmp_path and path.name == f"tiny-home_me_envs_my_env.py_make-{recipe.key()}"
    # the built-ins keep their names (and their keys: cached builds stay valid)
    assert tiny.cache_path(tiny.TinyRecipe()).name == "tiny-search-578b34eb2c2a"


@pytest.mark.parametrize("key", ["env.step_timeout_s=5", "env.max_observation_chars=1000",
                                 "env.deterministic=false"])
def test_the_env_boundary_checks_load_the_same_build(key):
    """The boundary checks of a run stop a broken env and never change the world: the shipped
    agent still loads with any of them set."""
    recipe = tiny_recipe(load_config(None, [key]))
    assert recipe.key() == tiny_recipe(load_config(None, None)).key()
    assert tiny.shipped_path(recipe) == tiny.SHIPPED / "search"


def test_a_value_head_fitted_on_another_env_is_not_reused(monkeypatch):
    """The shipped `search` agent's warm critic starts a run on `search`; on another env (or
    another world of search) the run starts a cold critic and says why in one line."""
    import agentrl_cli.train.learner as learner
    from agentrl_cli.app.tiny_build import load_policy

    folder = tiny.SHIPPED / "search"
    assert tiny.fitted_env_differences(folder, load_config(None, None).env) == []
    diff = tiny.fitted_env_differences(folder, load_config(None, ["env.name=locate"]).env)
    assert diff and diff[0].startswith("env: 'search' vs 'locate'")
    assert any(d.startswith("min_hops") for d in tiny.fitted_env_differences(
        folder, load_config(None, ["env.min_hops=3"]).env))
    assert tiny.fitted_env_differences(folder, load_config(None, ["env.call_cost=0.1"]).env) == []
    cfg = load_config(None, None)
    model = load_policy(cfg, log=lambda s: None)[0]
    loaded, logs = [], []
    monkeypatch.setattr(learner, "load_head_state", lambda c, s: loaded.append(s))
    learner.initial_critic(cfg, model, str(folder), log=logs.append)
    assert len(loaded) == 1 and "value head starts from" in logs[0]
    other = load_config(None, ["env.name=locate"])
    learner.initial_critic(other, model, str(folder), log=logs.append)
    assert len(loaded) == 1 and "fitted on another env (env: 'search' vs 'locate')" in logs[-1]
    assert "starting a cold critic" in logs[-1]


def test_a_changed_env_rebuilds_its_cached_agent_and_refuses_a_stale_shipped_one(monkeypatch):
    """The recipe (and its key) stays the same when an env's observations change; the build's
    recorded world (its expert's first episodes) tells the builds apart: a cached build is
    made again with one line, a shipped one is refused with one line."""
    from agentrl_cli.errors import ConfigError
    from agentrl_cli.envs.rules import RulesEnv
    from agentrl_cli.app import tiny_build

    recipe = tiny_recipe(load_config(None, MICRO + ["env.seed=4242"]))
    path = tiny_build.ensure_tiny(recipe, log=lambda s: None)
    world = json.loads((path / "recipe.json").read_text())["world"]
    assert world == tiny_build.world_fingerprint(recipe) and world
    logs = []
    assert tiny_build.ensure_tiny(recipe, log=logs.append) == path and not logs   # unchanged
    monkeypatch.setattr(tiny_build, "world_fingerprint", lambda r: "0123456789ab")
    assert tiny_build.ensure_tiny(recipe, log=logs.append) == path
    assert any("changed since its cached tiny agent was built" in line
               and f"made for world {world}" in line for line in logs), logs
    assert json.loads((path / "recipe.json").read_text())["world"] == "0123456789ab"
    shipped = tiny_recipe(load_config(SHIPPED["rules"][1], None))
    with pytest.raises(ConfigError, match="does not fit the env"):
        tiny_build.ensure_tiny(shipped, log=lambda s: None)
    monkeypatch.undo()
    # what the fingerprint sees: the system prompt and the observations
    before = tiny_build.world_fingerprint(shipped)
    monkeypatch.setattr(RulesEnv, "system_prompt", RulesEnv.system_prompt + " ")
    assert tiny_build.world_fingerprint(shipped) != before
    monkeypatch.undo()
    tool = RulesEnv._tool
    monkeypatch.setattr(RulesEnv, "_tool", lambda self, t, a: (tool(self, t, a)[0] + ".",
                                                               tool(self, t, a)[1]))
    assert tiny_build.world_fingerprint(shipped) != before


FAMILIES = ["rules", "math", "locate"]


def _no_build(tmp_path, monkeypatch) -> list[Path]:
    """An empty cache, a build that fails the test if it starts, and the folders `--model tiny`
    resolved to (appended as commands resolve them)."""
    from agentrl_cli.app import tiny_build

    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tiny_build, "publish_build",
                        lambda *a, **k: pytest.fail("a tiny build started"))
    used: list[Path] = []
    ensure = tiny_build.ensure_tiny
    monkeypatch.setattr(tiny_build, "ensure_tiny",
                        lambda recipe, log=print: used.append(ensure(recipe, log)) or used[-1])
    return used


@pytest.mark.parametrize("family", FAMILIES)
def test_eval_env_name_starts_from_the_shipped_agent(family, tmp_path, monkeypatch):
    """`agentrl eval --env NAME` on an empty cache loads the agent that ships for NAME: the
    benchmark entry named like the env sets the world it was built on (benchmarks.yaml)."""
    used = _no_build(tmp_path, monkeypatch)
    r = CliRunner().invoke(app, ["eval", "--env", family, "--tasks", "1", "--n", "1"])
    assert r.exit_code == 0, r.output
    assert used == [tiny.SHIPPED / family] and "building" not in r.output
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


@pytest.mark.parametrize("family", FAMILIES)
def test_benchmark_name_starts_from_the_shipped_agent(family, tmp_path, monkeypatch):
    """`--benchmark NAME` (here with `agentrl rollout`) finds the same shipped agent, and train's
    config resolves to it too."""
    used = _no_build(tmp_path, monkeypatch)
    r = CliRunner().invoke(app, ["rollout", "--benchmark", family, "--n", "1", "--split", "eval",
                                 "--out", str(tmp_path / "e.jsonl")])
    assert r.exit_code == 0, r.output
    assert used == [tiny.SHIPPED / family]
    for cfg in (load_config(None, None, family), load_config(None, None, method="grpo",
                                                             env=family)):
        assert tiny.shipped_path(tiny_recipe(cfg)) == tiny.SHIPPED / family


def test_a_world_no_agent_ships_for_says_the_measured_time_and_the_way_around(tmp_path, monkeypatch):
    """Where nothing ships, the line before the build gives the shipped builds' measured times
    (their recipe.json) and the `--set` that reaches the env's shipped agent."""
    from agentrl_cli.app import tiny_build

    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))

    def stop(*a, **k):
        raise SystemExit(7)
    monkeypatch.setattr(tiny_build, "publish_build", stop)
    r = CliRunner().invoke(app, ["eval", "--env", "rules", "--set", "env.n_train=595",
                                 "--tasks", "1", "--n", "1"])
    assert r.exit_code == 7, r.output
    line = " ".join(r.output.split())
    secs = sorted(json.loads(p.read_text())["build_seconds"]
                  for p in tiny.SHIPPED.glob("*/recipe.json")
                  if json.loads(p.read_text())["recipe"]["max_steps"] == 4800)
    assert f"took {secs[0] / 60:.0f}-{secs[-1] / 60:.0f} min each" in line, line
    rules = json.loads((tiny.SHIPPED / "rules" / "recipe.json").read_text())["build_seconds"]
    assert f"('rules' {rules / 60:.0f} min)" in line
    assert "--set env.n_train=10000 starts from it at once" in line


def test_build_threads_follow_the_option_then_omp_num_threads(monkeypatch):
    from agentrl_cli.app.tiny_build import BUILD_THREADS, build_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert build_threads() == BUILD_THREADS == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert build_threads() == 1 and build_threads(3) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "lots")
    assert build_threads() == BUILD_THREADS


def test_build_tiny_respects_the_machine_and_ends_with_the_whole_train_command(tmp_path, monkeypatch):
    """`--threads` (over OMP_NUM_THREADS) sets the build's torch threads; a measured estimate
    comes after the first warm-up steps, before any later progress line; the closing hint
    trains on the build in its own world (--env and the env.* settings)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    out = tmp_path / "b"
    sets = [a for s in MICRO + ["model.tiny_warmup_steps=25"] for a in ("--set", s)]
    r = CliRunner().invoke(app, ["build-tiny", "--out", str(out), "--threads", "1", *sets])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert "on 1 thread(s)" in lines[0] and lines[1].startswith("tiny: building on 1 torch thread")
    est = [i for i, ln in enumerate(lines) if "s a step on 1 thread(s), measured" in ln]
    assert len(est) == 1 and "at most 25 steps: about" in lines[est[0]]
    assert not any(ln.startswith("tiny: warm-up step") for ln in lines[:est[0]])
    assert json.loads((out / "recipe.json").read_text())["threads"] == 1
    assert lines[-1] == f"train on it: agentrl train --model {out} --env search --set env.max_turns=3"
    r = CliRunner().invoke(app, ["build-tiny", "--out", str(tmp_path / "c"), "--threads", "0"])
    assert r.exit_code == 2
