"""`--benchmark search-long`: the long-horizon variant of the search env (4-5 hops)."""
from __future__ import annotations

import random

from agentrl_cli.app.preflight import load_config
from agentrl_cli.config import RunConfig
from agentrl_cli.models.loading import tiny_recipe
from agentrl_cli.models.tiny import TinyRecipe, cache_path, train_tokenizer
from agentrl_cli.context import make_spec

from env_checks import run_expert


def test_selector_resolves_to_the_long_config():
    cfg = load_config(None, None, benchmark="search-long")
    assert (cfg.env.name, cfg.env.min_hops, cfg.env.max_hops, cfg.env.max_turns) == ("search", 4, 5, 16)
    assert cfg.rollout.max_tokens == 1024
    assert cfg.train.eval_tasks == RunConfig().train.eval_tasks
    # --set still wins over the benchmark's presets
    cfg = load_config(None, ["env.max_turns=20"], benchmark="search-long")
    assert (cfg.env.max_hops, cfg.env.max_turns) == (5, 20)
    # the tiny model is built for it (its own cache key); the default build's key is untouched
    long_recipe = tiny_recipe(load_config(None, None, benchmark="search-long"))
    assert (long_recipe.env.min_hops, long_recipe.env.max_hops, long_recipe.env.max_turns) == (4, 5, 16)
    assert long_recipe.max_positions >= 1024
    assert long_recipe.error_rate == 0.05 and TinyRecipe().error_rate == 0.15
    default = tiny_recipe(load_config(None, None, env="search"))
    assert default == TinyRecipe() and default.key() != long_recipe.key()
    # the keys of the cached builds (the recipe holds the env section; its key hashes the
    # fields under the names they had when it copied them one by one)
    assert (default.key(), long_recipe.key()) == ("578b34eb2c2a", "7f60a6b6c183")
    assert str(cache_path(default)).endswith("tiny-search-578b34eb2c2a")
    assert TinyRecipe.from_flat(long_recipe.flat()) == long_recipe
    # the recipe's own seed and the env's seed come back apart (`seed` is the recipe's)
    other = TinyRecipe(seed=1)
    assert TinyRecipe.from_flat(other.flat()) == other and other.env.seed == 0
    assert TinyRecipe.from_flat({"env_seed": 2}).env.seed == 2
    # `--env search` keeps the default env, not the long variant's presets
    cfg = load_config(None, None, env="search")
    assert (cfg.env.min_hops, cfg.env.max_hops, cfg.env.max_turns) == (2, 3, 12)
    assert cfg.rollout.max_tokens == RunConfig().rollout.max_tokens


def test_expert_needs_eight_or_more_tool_calls():
    cfg = load_config(None, None, benchmark="search-long")
    spec = make_spec(cfg)
    rng = random.Random(0)
    texts, seen_hops = [], set()
    for task in spec.tasks("eval") + spec.tasks("train")[:100]:
        env = spec.make()
        texts.append(env.reset(task))
        actions, results = run_expert(spec, env, task, rng)
        calls = [a for a in actions if not a.startswith("answer(")]
        assert results[-1].terminated and results[-1].reward == 1.0, task.prompt
        assert len(calls) == 2 * task.meta["hops"] >= 8, (task.prompt, actions)
        assert len(actions) <= cfg.env.max_turns
        seen_hops.add(task.meta["hops"])
        texts += actions + [r.observation for r in results if r.observation]
    assert seen_hops == {4, 5}
    # a whole expert episode fits the episode token cap with a tokenizer like the tiny model's
    tok = train_tokenizer(texts, 1024)
    env = spec.make()
    for task in spec.tasks("eval"):
        prompt = env.reset(task)
        actions, results = run_expert(spec, env, task, rng)
        n = len(tok(prompt + spec.make().system_prompt)["input_ids"]) + sum(
            len(tok(t)["input_ids"]) + 6 for t in actions + [r.observation for r in results])
        assert n < cfg.rollout.max_tokens, (task.prompt, n)
