"""The path scheduler (virtual clock) and Ray rollout workers: the same trees and episodes as the
in-process runner for the same seeds, with 1 local executor or 2 Ray workers, a worker killed
mid-step, and weights synced to the workers."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from agentrl_cli import config
from agentrl_cli.errors import ConfigError
from agentrl_cli.engines.hf import HFEngine
from agentrl_cli.engines.base import SamplingParams
from agentrl_cli.rollout import planner as focus_mod
from agentrl_cli.rollout.executors import HFPathExecutor
from agentrl_cli.rollout.pools import LocalPool, RayPool, ray_temp_dir
from agentrl_cli.rollout.scheduler import PathRunner
from agentrl_cli.rollout.values import CriticValues
from agentrl_cli.rollout.controllers import CONTROLLERS, RolloutContext
from agentrl_cli.rollout.runner import run_episodes

from conftest import MICRO, random_value_head

PARAMS = SamplingParams(max_new_tokens=8)


def _cfg(*sets):
    return config.load(sets=MICRO + list(sets), method="focus")


def _ctx(micro_policy, algo, batch_size=3, seed=0, head=None, budget=0, group_size=3, model=None):
    m, tok, fmt, spec = micro_policy
    return RolloutContext(HFEngine(model or m, fmt.pad_id), fmt, spec, PARAMS, group_size, 512,
                          batch_size, budget, torch.Generator().manual_seed(seed), algo=algo,
                          critic=head)


def _same(ref, res, trees=True):
    assert len(ref.episodes) == len(res.episodes)
    for a, b in zip(ref.episodes, res.episodes):
        assert a.token_ids == b.token_ids
        assert a.response_mask == b.response_mask and a.segment_index == b.segment_index
        assert (a.reward, a.finish, a.group, a.meta) == (b.reward, b.finish, b.group, b.meta)
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-5)
    if trees:
        for ta, tb in zip(ref.trees, res.trees):
            assert ta.to_json()["paths"] == tb.to_json()["paths"]
            assert [(n.parent, n.position, n.launched, n.n, n.csum, n.inflight) for n in ta.nodes] == \
                   [(n.parent, n.position, n.launched, n.n, n.csum, n.inflight) for n in tb.nodes]
            for na, nb in zip(ta.nodes, tb.nodes):
                assert (na.v is None) == (nb.v is None)
                if na.v is not None:
                    assert abs(na.v - nb.v) < 1e-4


@pytest.fixture(scope="module")
def focus_case(micro_policy):
    """An in-process FOCUS step with branching (capacity 3 < 9 paths, a critic head)."""
    model = micro_policy[0]
    head = random_value_head(model)
    algo = _cfg("algo.focus_roots=1").algo
    tasks = micro_policy[3].tasks("train", 3)
    ref = CONTROLLERS.get("focus").run(_ctx(micro_policy, algo, head=head), tasks)
    assert ref.metrics["focus/continuations"] > 0, "the case must branch"
    return ref, head, algo, tasks


# ----------------------------------------------------------------------------- no Ray


@pytest.mark.parametrize("ticks", [1, 4])
def test_scheduler_builds_the_in_process_trees(micro_policy, focus_case, ticks):
    model, tok, fmt, spec = micro_policy
    ref, head, algo, tasks = focus_case
    ex = HFPathExecutor(HFEngine(model, fmt.pad_id), fmt, spec, PARAMS, 512, share=3)
    runner = PathRunner(LocalPool(ex), CriticValues(model, head), ticks=ticks)
    res = CONTROLLERS.get("focus").run_paths(_ctx(micro_policy, algo, head=head), tasks, runner)
    _same(ref, res)


@pytest.mark.parametrize("evidence", ["own", "subtree"])
def test_scheduler_matches_in_process_under_a_token_budget(micro_policy, focus_case, evidence):
    """The budget charges running paths' expected remaining tokens; on the virtual clock a
    running path has generated one token per tick, so both make the same launch decisions."""
    model, tok, fmt, spec = micro_policy
    _, head, algo, tasks = focus_case
    algo = dataclasses.replace(algo, focus_evidence=evidence)
    ref = CONTROLLERS.get("focus").run(_ctx(micro_policy, algo, head=head, budget=90), tasks)
    ex = HFPathExecutor(HFEngine(model, fmt.pad_id), fmt, spec, PARAMS, 512, share=3)
    runner = PathRunner(LocalPool(ex), CriticValues(model, head), ticks=2)
    res = CONTROLLERS.get("focus").run_paths(_ctx(micro_policy, algo, head=head, budget=90), tasks,
                                          runner)
    assert ref.metrics["focus/continuations"] > 0
    _same(ref, res)


def test_linear_paths_equal_runner_with_per_episode_generators(micro_policy):
    model, tok, fmt, spec = micro_policy
    algo = _cfg().algo
    tasks = spec.tasks("train", 2)
    ex = HFPathExecutor(HFEngine(model, fmt.pad_id), fmt, spec, PARAMS, 512, share=2)
    runner = PathRunner(LocalPool(ex), CriticValues(model, None), ticks=3)
    res = CONTROLLERS.get("linear").run_paths(_ctx(micro_policy, algo, batch_size=2, seed=5), tasks, runner)
    base = focus_mod.seed_base(torch.Generator().manual_seed(5))
    pairs = [(t, g) for g, t in enumerate(tasks) for _ in range(3)]
    gens = [focus_mod.path_generator(base, i) for i in range(len(pairs))]
    ref = run_episodes(HFEngine(model, fmt.pad_id), fmt, spec, pairs, PARAMS, 512, len(pairs), gens)
    assert sum(e.num_turns for e in ref) > len(ref), "needs multi-turn episodes"
    assert [e.group for e in res.episodes] == [0, 0, 0, 1, 1, 1]
    for a, b in zip(res.episodes, ref):
        assert a.token_ids == b.token_ids and a.response_mask == b.response_mask
        assert (a.reward, a.finish, a.num_tool_calls, a.meta) == (b.reward, b.finish, b.num_tool_calls, b.meta)


def test_ray_temp_dir_falls_back_when_sockets_would_be_too_long(tmp_path):
    msgs = []
    assert ray_temp_dir("/tmp/r", msgs.append) == "/tmp/r/ray" and not msgs
    deep = tmp_path / ("x" * 60)
    short = ray_temp_dir(deep, msgs.append)
    assert len(short) < 40 and "agentrl-ray-" in short
    assert len(msgs) == 1 and "too long" in msgs[0]


def test_workers_refuse_in_process_only_controllers():
    """Checked with the other names, before any model loads (`app.preflight`)."""
    from agentrl_cli.app.preflight import check_names

    for sets, what in ((["rollout.workers=2"], "vine"), (["rollout.workers=2", "algo.dynamic_sampling=true"], "dynamic")):
        cfg = config.load(sets=MICRO + sets, method="vineppo" if what == "vine" else "dapo")
        with pytest.raises(ConfigError, match="in process only"):
            check_names(cfg)


# ----------------------------------------------------------------------------- Ray


@pytest.fixture(scope="module")
def ray_pool(micro_policy, tmp_path_factory):
    """One local Ray session (2 CPUs) and a pool of 2 workers for the whole module."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, _temp_dir=ray_temp_dir(tmp_path_factory.mktemp("r")),
             include_dashboard=False, log_to_driver=False)
    pool = RayPool(_cfg("rollout.workers=2", "rollout.batch_size=3"), 2, log=lambda s: None)
    pool.sync(micro_policy[0].state_dict())
    yield pool
    pool.close()
    ray.shutdown()


def test_two_ray_workers_build_the_in_process_trees(micro_policy, focus_case, ray_pool):
    ref, head, algo, tasks = focus_case
    runner = PathRunner(ray_pool, CriticValues(micro_policy[0], head), ticks=4)
    res = CONTROLLERS.get("focus").run_paths(_ctx(micro_policy, algo, head=head), tasks, runner)
    _same(ref, res)
    assert set(runner.pool.futures) == set()


def test_weights_reach_the_workers(micro_policy, ray_pool):
    model, tok, fmt, spec = micro_policy
    changed = copy.deepcopy(model)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    algo = _cfg().algo
    tasks = spec.tasks("train", 2)
    ray_pool.sync(changed.state_dict())
    try:
        runner = PathRunner(ray_pool, CriticValues(changed, None), ticks=4)
        res = CONTROLLERS.get("linear").run_paths(_ctx(micro_policy, algo, seed=9, group_size=2), tasks, runner)
    finally:
        ray_pool.sync(model.state_dict())
    base = focus_mod.seed_base(torch.Generator().manual_seed(9))
    pairs = [(t, g) for g, t in enumerate(tasks) for _ in range(2)]
    gens = [focus_mod.path_generator(base, i) for i in range(len(pairs))]
    ref_new = run_episodes(HFEngine(changed, fmt.pad_id), fmt, spec, pairs, PARAMS, 512, 4, gens)
    gens = [focus_mod.path_generator(base, i) for i in range(len(pairs))]
    ref_old = run_episodes(HFEngine(model, fmt.pad_id), fmt, spec, pairs, PARAMS, 512, 4, gens)
    assert [e.token_ids for e in res.episodes] == [e.token_ids for e in ref_new]
    assert [e.token_ids for e in res.episodes] != [e.token_ids for e in ref_old]


def test_killed_worker_mid_step_still_yields_the_same_step(micro_policy, focus_case, ray_pool):
    import ray

    ref, head, algo, tasks = focus_case
    killed = []

    def kill_after_second_report(sched):
        if sched.reports == 2 and not killed:
            victim = next(w for w in range(2) if any(o == w for o in sched.owner.values()))
            ray.kill(ray_pool.actors[victim])
            killed.append(victim)

    before = ray_pool.replaced
    runner = PathRunner(ray_pool, CriticValues(micro_policy[0], head), ticks=2,
                          after_report=kill_after_second_report)
    res = CONTROLLERS.get("focus").run_paths(_ctx(micro_policy, algo, head=head), tasks, runner)
    assert killed and ray_pool.replaced == before + 1
    _same(ref, res)


def test_scheduler_runs_context_operators_as_the_in_process_runner(micro_policy):
    """The path executor and the in-process runner share one token loop, so a context
    operator (compaction: nodes at context resets, continuations resuming the node's window)
    gives the same trees and episodes on the path scheduler."""
    from agentrl_cli import context as context_mod

    model, tok, fmt, _ = micro_policy
    cfg = config.load(method="focus", sets=MICRO + [
        "env.max_turns=6", "context.operator=compaction", "context.threshold_tokens=110",
        "algo.focus_roots=1", "algo.focus_allocator=uniform"])
    spec = context_mod.make_spec(cfg)
    head = random_value_head(model)
    tasks = spec.tasks("train", 2)

    def ctx():
        return RolloutContext(HFEngine(model, fmt.pad_id), fmt, spec, PARAMS, 2, 900, 4, 420,
                              torch.Generator().manual_seed(1), algo=cfg.algo, critic=head)

    ref = CONTROLLERS.get("focus").run(ctx(), tasks)
    assert ref.metrics["focus/continuations"] > 0
    assert all(len(ep.window_starts) >= 1 for ep in ref.episodes), "needs context resets"
    ex = HFPathExecutor(HFEngine(model, fmt.pad_id), fmt, spec, PARAMS, 900, share=4)
    runner = PathRunner(LocalPool(ex), CriticValues(model, head), ticks=2)
    res = CONTROLLERS.get("focus").run_paths(ctx(), tasks, runner)
    _same(ref, res)
    assert [ep.window_starts for ep in res.episodes] == [ep.window_starts for ep in ref.episodes]


def test_one_token_loop_drives_both_runners():
    """The in-process FOCUS runner and the hf path executor run the same per-token loop
    (`rollout.token_loop`): neither feeds the engine, samples or steps an env on its own."""
    import inspect

    from agentrl_cli.rollout import executors, focus

    for cls in (focus.FocusRunner, executors.HFPathExecutor):
        src = inspect.getsource(cls)
        assert "TokenLoop(" in src and ".tick(" in src, cls.__name__
        for own in ("sample_rows(", ".extend(", "advance(p", "apply_step(", "append_turn("):
            assert own not in src, (cls.__name__, own)


def test_scheduler_linear_honours_the_run_budget(micro_policy):
    """The path scheduler's linear controller spends as the in-process one does: whole groups
    while the step's limit (`controllers.spend_limit`) affords them, recorded in the carry."""
    model, tok, fmt, spec = micro_policy
    algo = _cfg().algo
    tasks = spec.tasks("train", 6)

    def step(budget, carry, seed):
        ex = HFPathExecutor(HFEngine(model, fmt.pad_id), fmt, spec, PARAMS, 512, share=4)
        runner = PathRunner(LocalPool(ex), CriticValues(model, None), ticks=3)
        ctx = _ctx(micro_policy, algo, batch_size=4, seed=seed, budget=budget, group_size=2)
        ctx.carry = carry
        return CONTROLLERS.get("linear").run_paths(ctx, tasks, runner)

    full = step(0, {}, 0)
    assert len(full.episodes) == 12
    budget = int(full.tokens * 0.5)
    carry: dict = {}
    spent = [step(budget, carry, s).tokens for s in range(4)]
    assert carry["linear_spend"] == [float(sum(spent)), 4.0 * budget]
    assert abs(sum(spent) - 4 * budget) <= 2 * full.tokens / 6


def test_scheduler_linear_draws_more_tasks_when_its_groups_fall_short(micro_policy):
    """As the in-process controller: a budget beyond the step's own groups is met with fresh
    training tasks in whole groups."""
    model, tok, fmt, spec = micro_policy
    algo = _cfg().algo
    tasks = spec.tasks("train", 2)

    def step(budget):
        ex = HFPathExecutor(HFEngine(model, fmt.pad_id), fmt, spec, PARAMS, 512, share=4)
        runner = PathRunner(LocalPool(ex), CriticValues(model, None), ticks=3)
        ctx = _ctx(micro_policy, algo, batch_size=4, seed=3, budget=budget, group_size=2)
        return CONTROLLERS.get("linear").run_paths(ctx, tasks, runner)

    full = step(0)
    assert len(full.episodes) == 4 and full.metrics["rollout/drawn_groups"] == 0
    budget = int(full.tokens * 3)
    res = step(budget)
    firsts = {}
    for e in res.episodes:
        firsts.setdefault(e.group, e.task_id)
    assert len(firsts) > 3 and len(set(firsts.values())) == len(firsts)
    assert [firsts[0], firsts[1]] == [t.task_id for t in tasks]
    assert res.metrics["rollout/drawn_groups"] == len(firsts) - 2
    assert abs(res.tokens - budget) <= 1.5 * full.tokens / 2

