"""diagnose: audit tree (allocators on a tree with known values), critic ranking, MPO's variance
decomposition, tool-call trends; the commands end to end on a micro run with a critic."""
from __future__ import annotations

import json
import math
import random

import pytest
import torch
from typer.testing import CliRunner

from agentrl_cli import config
from agentrl_cli.cli.main import app
from agentrl_cli.credit import refine_values
from agentrl_cli.diagnostics import audit as A
from agentrl_cli.metrics import ranks, spearman
from agentrl_cli.diagnostics.tool_calls import detect_collapse, trailing_mean
from agentrl_cli.diagnostics.variance import decompose, summarize
from agentrl_cli.rollout import planner as focus_mod

from conftest import MICRO

runner = CliRunner()


# ----------------------------------------------------------------------------- audit tree


def test_latent_tree_values_are_exact_backups():
    #      0
    #    /   \        p = (0.3, 0.7)
    #   1     2       1: leaf p=0.9; 2 -> 3 (0.5, leaf p=0.2), 4 (0.5, leaf p=0.6)
    #        / \
    #       3   4
    t = A.LatentTree([[1, 2], [], [3, 4], [], []], [[0.3, 0.7], [], [0.5, 0.5], [], []],
                     [0.0, 0.9, 0.0, 0.2, 0.6])
    assert t.value == pytest.approx([0.3 * 0.9 + 0.7 * 0.4, 0.9, 0.4, 0.2, 0.6])
    rng = random.Random(0)
    draws = [t.walk(0, rng)[1] for _ in range(20000)]
    assert sum(draws) / len(draws) == pytest.approx(t.value[0], abs=0.015)


def _own_leaves(tree, nd):
    """Leaves whose path is an own sample of `nd`: it created nd, or was launched from nd (a
    path's origin is the deepest node on it that another path created; the root for roots)."""
    out = []
    for x in tree.nodes:
        if not x.terminal or nd.id not in tree.ancestry(x.id):
            continue
        ids = tree.paths[x.path][:-1]
        others = [i for i in ids if tree.nodes[i].path != x.path]
        origin = others[-1] if others else 0
        if nd.id == x.id or nd.path == x.path or origin == nd.id:
            out.append(x)
    return out


@pytest.mark.parametrize("evidence", ["own", "subtree"])
def test_simulation_bookkeeping_and_incremental_refine(evidence):
    """Counts after a run agree with the paths; the incremental backup equals refine_values."""
    spec = A.AuditSpec(max_budget=40, roots=2, capacity=3, seeds=1, evidence=evidence)
    world = A.SyntheticWorld.make(3, tasks=3, grow=True)
    sim = A.AuditSim(world, A.make_critic("random"), "focus", spec, seed=0)
    curve = sim.run()
    assert len(curve) == 41
    leaves = 0
    for t, tree in enumerate(sim.trees):
        assert all(nd.inflight == 0 and nd.own_inflight == 0 for nd in tree.nodes)
        n_leaves = sum(nd.terminal for nd in tree.nodes)
        leaves += n_leaves
        launched = sum(nd.launched for nd in tree.nodes)
        assert launched == n_leaves - spec.roots
        if evidence == "subtree":
            assert tree.nodes[0].n == n_leaves
        else:   # the root's own samples: its root episodes and the continuations launched from it
            assert tree.nodes[0].n == spec.roots + tree.nodes[0].launched
        for nd in tree.nodes:  # n and cbar of every node = its own samples' (subtree: all leaves below)
            below = ([x for x in tree.nodes if x.terminal and nd.id in tree.ancestry(x.id)]
                     if evidence == "subtree" else _own_leaves(tree, nd))
            assert nd.n == len(below) and nd.csum == pytest.approx(sum(x.reward for x in below))
            if evidence == "own" and not nd.terminal and nd.n and nd.id != 0:
                assert nd.n == 1 + nd.launched       # the creating path + its continuations
        # the incremental backup is exactly credit.refine_values on the whole tree
        parent = [nd.parent for nd in tree.nodes]
        _, vt = refine_values(parent, [nd.reward for nd in tree.nodes],
                              [0.0 if nd.terminal else nd.v for nd in tree.nodes], spec.kappa, spec.gamma)
        assert [sim.vt[t][nd.id] for nd in tree.nodes] == pytest.approx(vt, abs=1e-12)
    assert leaves == 3 * spec.roots + 40
    # the reported MSE is over the audit nodes only (the root episodes' states), with their truth
    want = sum((sim.vt[t][i] - world.trees[t].value[sim.states[t][i].key]) ** 2
               for t in range(3) for i in sim.audit[t]) / sim.n_audit
    assert curve[-1] == pytest.approx(want)


def test_the_audit_honours_the_runs_min_depth():
    """`algo.focus_min_depth` reaches the audit (`audit_spec`), which then launches only from
    states that deep; without it the same simulation launches from shallower ones too."""
    from agentrl_cli import config
    from agentrl_cli.diagnostics.audit_tree import AuditRequest, audit_spec
    depths = {}
    for k in (0, 2):
        spec = audit_spec(AuditRequest(budget=30, seeds=1),
                          config.load(sets=[f"algo.focus_min_depth={k}"], method="focus"))
        assert spec.min_depth == k
        sim = A.AuditSim(A.SyntheticWorld.make(3, tasks=3, grow=True), A.make_critic("random"),
                         "focus", spec, seed=0)
        sim.run()
        depths[k] = [nd.depth for t in sim.trees for nd in t.nodes if nd.launched]
    assert depths[2] and min(depths[2]) >= 2 and min(depths[0]) < 2


def test_uniform_spreads_evenly_over_the_fixed_audit_tree():
    spec = A.AuditSpec(max_budget=100, seeds=1)
    sim = A.AuditSim(A.SyntheticWorld.make(1), A.make_critic("constant", 0.5), "uniform", spec, seed=0)
    sim.run()
    launched = [sim.trees[t].nodes[i].launched for t in range(len(sim.trees)) for i in sim.audit[t]]
    assert sum(launched) == 100 and max(launched) - min(launched) <= 1
    # continuation states of the fixed audit tree are never branched from
    assert all(nd.launched == 0 for t, tree in enumerate(sim.trees) for nd in tree.nodes
               if nd.id not in sim.audit[t])


def test_the_simulation_and_the_runner_share_the_allocation_decision(monkeypatch, micro_policy):
    from agentrl_cli.engines.hf import HFEngine
    from agentrl_cli.engines.base import SamplingParams
    from agentrl_cli.rollout.controllers import CONTROLLERS, RolloutContext

    calls = {"sim": 0, "runner": 0}
    real = focus_mod.pick_continuation

    def spy(who):
        def f(*a, **k):
            calls[who] += 1
            return real(*a, **k)
        return f

    monkeypatch.setattr(A, "pick_continuation", spy("sim"))
    A.AuditSim(A.SyntheticWorld.make(0, tasks=1), A.make_critic("random"), "focus",
               A.AuditSpec(max_budget=5), 0).run()
    monkeypatch.setattr(focus_mod, "pick_continuation", spy("runner"))
    model, tok, fmt, spec = micro_policy
    algo = config.load(sets=MICRO + ["algo.focus_roots=1"], method="focus").algo
    ctx = RolloutContext(HFEngine(model, fmt.pad_id), fmt, spec, SamplingParams(max_new_tokens=8),
                         3, 512, 2, 0, torch.Generator().manual_seed(0), algo=algo)
    res = CONTROLLERS.get("focus").run(ctx, spec.tasks("train", 1))
    assert res.metrics["focus/continuations"] == 2
    assert calls["sim"] >= 5 and calls["runner"] >= 2


def test_budget_to_reach_and_ratio():
    assert A.budget_to_reach([1.0, 0.8, 0.4, 0.2], 0.6) == pytest.approx(1.5)
    assert A.budget_to_reach([1.0, 0.8], 0.1) == math.inf
    assert A.budget_to_reach([0.5, 0.8], 0.6) == 0.0
    r = A.budget_ratios([[1.0, 0.5, 0.25, 0.2, 0.1]], [[1.0, 0.9, 0.8, 0.6, 0.5]], [0, 1, 2, 4])
    assert r == pytest.approx({"1": 0.2 / 1, "2": 0.4 / 2, "4": 1.0 / 4})


@pytest.fixture(scope="module")
def audit_result():
    """The done criterion's setting: the default synthetic tree, 10 seeds."""
    worlds = [A.SyntheticWorld.make(s) for s in range(10)]
    spec = A.AuditSpec(max_budget=64, seeds=10, allocators=("focus", "uniform", "raw-residual"))
    return A.run_audit(lambda s: worlds[s], spec)


@pytest.mark.parametrize("critic", ["constant", "random"])
def test_focus_needs_at_most_half_the_uniform_budget(audit_result, critic):
    res = audit_result[critic]
    for B in ("8", "16", "32", "64"):
        assert res["focus"]["budget_ratio"][B] <= 0.5, (critic, B, res["focus"]["budget_ratio"])
    for j, B in enumerate(res["focus"]["budgets"]):
        if B >= 8:  # raw residual does worse than FOCUS
            assert res["raw-residual"]["mse"][j] > res["focus"]["mse"][j]
            assert res["uniform"]["mse"][j] > res["focus"]["mse"][j]


def test_constant_critic_at_one_half_gives_focus_little_to_skip():
    """Honest limit (README): a constant 0.5 critic is equally wrong at every near-deterministic
    state, so FOCUS's ratio stays well above what it reaches with the mean-value constant."""
    worlds = [A.SyntheticWorld.make(s) for s in range(10)]
    ratio = {}
    for c in (None, 0.5):
        spec = A.AuditSpec(max_budget=32, seeds=10, allocators=("focus", "uniform"),
                           critics=("constant",), constant=c)
        ratio[c] = A.run_audit(lambda s: worlds[s], spec)["constant"]["focus"]["budget_ratio"]["32"]
    assert ratio[None] < 0.5 < ratio[0.5]


def test_audit_tree_cli_synthetic(tmp_path):
    js, png = tmp_path / "audit.json", tmp_path / "audit.png"
    r = runner.invoke(app, ["diagnose", "audit-tree", "--budget", "8", "--seeds", "2",
                            "--json", str(js), "--png", str(png)])
    assert r.exit_code == 0, r.output
    assert "ratio" in r.output and png.stat().st_size > 1000
    data = json.loads(js.read_text())
    assert set(data) == {"constant", "random"}
    for per in data.values():
        assert set(per) == set(A.ALLOCATOR_NAMES)
        for d in per.values():
            assert d["budgets"] == [0, 1, 2, 4, 8] and len(d["mse"]) == 5
            assert all(m >= 0 for m in d["mse"])
        assert len({d["mse"][0] for d in per.values()}) == 1  # same audit tree for all allocators
    r = runner.invoke(app, ["diagnose", "audit-tree", "--allocators", "focus,bogus"])
    assert r.exit_code == 2 and "bogus" in r.output
    r = runner.invoke(app, ["diagnose", "audit-tree", "--critics", "trained"])
    assert r.exit_code == 2 and "--checkpoint" in r.output


# ----------------------------------------------------------------------------- pure statistics


def test_spearman_hand_values():
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert ranks([3.0, 1.0, 1.0, 2.0]) == [4.0, 1.5, 1.5, 3.0]
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(1.5 / math.sqrt(3))
    assert spearman([5, 4, 3], [0.1, 0.2, 0.9]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1], [1, 2, 3]) is None and spearman([1], [2]) is None


def test_variance_decomposition():
    assert decompose([[0, 0], [1, 1]]) == pytest.approx((0.25, 0.25, 0.0))
    assert decompose([[0, 1], [0, 1]]) == pytest.approx((0.25, 0.0, 0.25))
    g = torch.Generator().manual_seed(0)
    turns = [torch.rand(n, generator=g).tolist() for n in (3, 7, 1, 5)]
    total, between, within = decompose(turns)
    flat = torch.tensor([v for t in turns for v in t], dtype=torch.float64)
    assert total == pytest.approx(float(flat.var(unbiased=False)))
    assert between + within == pytest.approx(total)
    s = summarize([[[0, 0], [1, 1]], [[0, 1], [0, 1]], [[0.2, 0.4]], [[0.5], [0.5]],
                   [[0.0, 0.1], [1.0, 1.2], [0.4]]])
    assert (s["used"], s["single_turn"], s["constant_critic"]) == (3, 1, 1)
    assert s["share_between_exceeds_within"] == pytest.approx(2 / 3)
    assert s["median_between_share"] == pytest.approx(sorted(s["shares"])[1])


def test_tool_call_collapse_rule():
    steps = list(range(1, 21))
    tc = [2.0] * 10 + [0.2] * 10
    falling = [0.5] * 10 + [0.1] * 10
    c = detect_collapse(steps, tc, falling, window=3, drop=0.5)
    assert c is not None and c["step"] == 12 and c["peak_step"] <= 10
    assert c["success_after"] < c["success_at_peak"]
    assert detect_collapse(steps, tc, [0.5] * 20, window=3) is None   # success did not fall
    assert detect_collapse(steps, [2.0, 0.1] * 10, falling, window=3) is None  # not sustained
    assert trailing_mean([1, 2, 3, 4], 2) == [1, 1.5, 2.5, 3.5]


def test_tool_calls_cli_on_a_written_metrics_file(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": 0, "eval/success": 0.2, "eval/tool_calls": 2.5}]
    for s in range(1, 31):
        rows.append({"step": s, "rollout/tool_calls": 2.5 if s <= 15 else 0.3,
                     "success": 0.4 if s <= 15 else 0.1})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    js = tmp_path / "tc.json"
    r = runner.invoke(app, ["diagnose", "tool-calls", "--run", str(run), "--json", str(js)])
    assert r.exit_code == 0, r.output
    assert "collapse" in r.output and (run / "tool_calls.png").is_file()
    data = json.loads(js.read_text())
    assert data["collapse"]["step"] == 18 and data["steps"] == list(range(1, 31))
    r = runner.invoke(app, ["diagnose", "tool-calls", "--run", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "no metrics.jsonl" in r.output


# ----------------------------------------------------------------------------- on a micro run


@pytest.fixture(scope="module")
def micro_run(tmp_path_factory, micro_policy):
    """Two steps of MPO (a critic) on the micro model, a checkpoint after each."""
    from agentrl_cli.app.train import train

    out = tmp_path_factory.mktemp("diag") / "mpo"
    cfg = config.load(sets=MICRO + ["train.steps=2", "train.save_every=1", "train.eval_every=0",
                                    "env.n_eval=6"], method="mpo", out=str(out))
    train(cfg, out, log=lambda s: None)
    return out


def test_critic_rank_on_a_run(micro_run, tmp_path):
    from agentrl_cli.diagnostics.mc import critic_at_states, load_checkpoint_policy, sample_episodes

    js = tmp_path / "rank.json"
    r = runner.invoke(app, ["diagnose", "critic-rank", "--run", str(micro_run), "--episodes", "2",
                            "--continuations", "2", "--json", str(js)])
    assert r.exit_code == 0, r.output
    data = json.loads(js.read_text())
    assert [c["step"] for c in data["checkpoints"]] == [1, 2]
    assert (micro_run / "critic_rank.png").is_file()
    # independent check at step 2: the same episodes, and V(s_k) from the trainer's forward pass
    cfg = config.load_saved(micro_run)
    pol = load_checkpoint_policy(cfg, micro_run / "checkpoints" / "step-000002")
    tasks = pol.spec.tasks("eval", 2)
    eps, states = sample_episodes(pol, [(t, g) for g, t in enumerate(tasks)], 0)
    row = data["checkpoints"][1]
    assert row["states"] == sum(len(e.segment_starts) for e in eps) == sum(len(s) for s in states)
    from agentrl_cli.train.batch import collate, forward
    batch = collate(eps, pol.fmt.pad_id)
    with torch.no_grad():
        _, values = forward(pol.model, pol.critic, batch, cfg.rollout.temperature)
    want = [float(values[b, s]) for b, e in enumerate(eps) for s in e.segment_starts]
    assert row["critic"] == pytest.approx(want, abs=1e-5)
    assert critic_at_states(pol, eps) == [pytest.approx([float(values[b, s]) for s in e.segment_starts], abs=1e-5)
                                          for b, e in enumerate(eps)]
    assert all(x in (0.0, 0.5, 1.0) for x in row["targets"])  # means of 2 0/1 rewards


def test_variance_on_a_checkpoint(micro_run, tmp_path):
    js = tmp_path / "var.json"
    r = runner.invoke(app, ["diagnose", "variance", "--checkpoint", str(micro_run), "--episodes", "4",
                            "--json", str(js), "--png", str(tmp_path / "v.png")])
    assert r.exit_code == 0, r.output
    data = json.loads(js.read_text())
    assert data["episodes"] == 4 and data["used"] + data["single_turn"] + data["constant_critic"] == 4
    assert data["used"] > 0 and 0.0 <= data["median_between_share"] <= 1.0
    assert "MPO paper" in r.output and (tmp_path / "v.png").is_file()


def test_variance_needs_a_critic(tmp_path, micro_policy):
    from agentrl_cli.train import checkpoint

    model, tok, _, _ = micro_policy
    out = tmp_path / "grpo"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config.load(sets=MICRO, method="grpo").to_dict()))
    checkpoint.save(out, 1, model, tok, {"step": 1, "value_head": None})
    r = runner.invoke(app, ["diagnose", "variance", "--checkpoint", str(out), "--episodes", "2"])
    assert r.exit_code == 2 and "no critic" in r.output


def test_audit_tree_on_a_checkpoint(micro_run, tmp_path):
    js = tmp_path / "audit.json"
    r = runner.invoke(app, ["diagnose", "audit-tree", "--checkpoint", str(micro_run), "--budget", "4", "--seeds", "2", "--tasks", "2",
                            "--samples", "3", "--json", str(js), "--png", str(tmp_path / "a.png")])
    assert r.exit_code == 0, r.output
    data = json.loads(js.read_text())
    assert set(data) == {"constant", "random", "trained"}  # trained: the checkpoint has a critic
    for per in data.values():
        assert len({d["mse"][0] for d in per.values()}) == 1
        assert all(len(d["mse"]) == 4 for d in per.values())  # budgets 0, 1, 2, 4


def test_env_world_audit_states_truth_and_pool(micro_run):
    from agentrl_cli.diagnostics.audit_env import EnvWorld
    from agentrl_cli.diagnostics.mc import load_checkpoint_policy
    from agentrl_cli.train.batch import collate, forward

    cfg = config.load_saved(micro_run)
    pol = load_checkpoint_policy(cfg, micro_run)
    w = EnvWorld(pol, n_tasks=2, roots=2, samples=2, seed=0)
    eps = w.episodes
    assert w.n_states == 2 + sum(len(e.segment_starts) - 1 for e in eps)  # one shared s_0 per task
    assert w.n_continuations == 2 * w.n_states and all(len(p) == 2 for p in w.pool)
    assert w.truth == [sum(d.reward for d in p) / 2 for p in w.pool]
    batch = collate(eps, pol.fmt.pad_id)
    with torch.no_grad():
        _, values = forward(pol.model, pol.critic, batch, cfg.rollout.temperature)
    for g in range(2):
        mine = [b for b, e in enumerate(eps) if e.group == g]
        assert w.root_state(g).critic == pytest.approx(float(values[mine[0], eps[mine[0]].segment_starts[0]]), abs=1e-5)
        for j, b in enumerate(mine):
            path = w.root_path(g, j, random.Random(0))
            assert path.reward == eps[b].reward and len(path.states) == len(eps[b].segment_starts) - 1
            assert [s.critic for s in path.states] == pytest.approx(
                [float(values[b, s]) for s in eps[b].segment_starts[1:]], abs=1e-5)
            assert all(s.resumable and s.truth is not None for s in path.states)
    draw = w.continuation(0, w.root_state(0), random.Random(0))
    assert draw in w.pool[w.root_key[0]] and not any(s.resumable for s in draw.states)


def test_continuations_resume_from_the_visible_context_under_compaction(micro_policy):
    from agentrl_cli.context.windows import visible_ids
    from agentrl_cli.diagnostics.mc import continue_from, load_checkpoint_policy, sample_episodes
    from agentrl_cli.app.tiny_build import ensure_model

    cfg = config.load(sets=MICRO + ["context.operator=compaction", "context.threshold_tokens=100",
                                    "env.max_turns=6"])
    ensure_model(cfg, log=lambda s: None)        # this env's tiny build (commands build it)
    pol = load_checkpoint_policy(cfg, None)
    (task,) = pol.spec.tasks("eval", 1)
    (ep,), (states,) = sample_episodes(pol, [(task, 0)], 0)
    assert ep.window_starts, "needs an episode with a context reset"
    assert [s.prefix for s in states] == [visible_ids(ep, s) for s in ep.segment_starts]
    assert len(states[-1].prefix) < ep.segment_starts[-1]           # the history was cut
    conts = continue_from(pol, states, 1, seed=1)
    for st, (c,) in zip(states, conts):
        assert c.token_ids[:len(st.prefix)] == st.prefix and c.context == ep.context
        assert c.window_prefix == ep.window_prefix and c.generated_tokens > 0


def test_separate_critic_run_trains_and_diagnoses(tmp_path):
    """`agentrl train --method ppo --set model.critic=separate` end to end, then the critic
    diagnostics read its checkpoint's separate critic."""
    out = tmp_path / "ppo-sep"
    r = runner.invoke(app, ["train", "--method", "ppo", "--out", str(out), "--steps", "2",
                            *[a for s in MICRO + ["train.save_every=2", "train.eval_every=0",
                                                  "model.critic=separate", "env.n_eval=6"]
                              for a in ("--set", s)]])
    assert r.exit_code == 0, r.output
    assert "critic: a separate model" in r.output
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(x["loss/critic"]) for x in rows if x["step"] > 0)
    js = tmp_path / "var.json"
    r = runner.invoke(app, ["diagnose", "variance", "--checkpoint", str(out), "--episodes", "3",
                            "--json", str(js), "--png", str(tmp_path / "v.png")])
    assert r.exit_code == 0, r.output
    assert json.loads(js.read_text())["episodes"] == 3


def test_rollout_trees_from_a_checkpoint_read_its_separate_critic(micro_run, tmp_path):
    """`agentrl rollout --method focus --checkpoint RUN` on a run whose critic is a separate
    model (mpo's recipe): each tree's root value is that critic's value of the prompt."""
    from agentrl_cli.diagnostics.mc import load_checkpoint_policy
    from agentrl_cli.models.critic import SeparateCritic, critic_hidden
    from agentrl_cli.models.sequences import hidden_states

    out = tmp_path / "trees.jsonl"
    args = ["rollout", "--method", "focus", "--checkpoint", str(micro_run), "--out", str(out),
            "--n", "4", "-g", "2"]
    for s in MICRO:
        args += ["--set", s]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    pol = load_checkpoint_policy(config.load_saved(micro_run), micro_run)
    assert isinstance(pol.critic, SeparateCritic)
    for line in out.read_text().splitlines():
        tree = json.loads(line)
        root = tree["nodes"][0]
        ep = tree["episodes"][str(root["path"])]
        ids = torch.tensor([ep["token_ids"][:root["position"]]])
        attn = torch.ones_like(ids)
        with torch.no_grad():
            h = critic_hidden(pol.critic, hidden_states(pol.model, ids, attn), ids, attn)
            v = float(pol.critic(h[0, -1].float()))
        assert abs(v - 0.5) > 1e-4, "the trained critic must have moved off its initial 0.5"
        assert root["v"] == pytest.approx(v, abs=1e-5)


def test_figure_titles_name_the_env_variant(tmp_path):
    """A run on the long horizon (or with compaction, or a call cost) is not titled as if it ran
    on the default `search` env: `plots.run_label` reads the run's env and context sections."""
    from agentrl_cli.reporting.plots import env_label, run_label

    assert env_label({"name": "search", "min_hops": 2, "max_hops": 3}) == "search"
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({
        "method": "focus", "seed": 2, "env": {"name": "search", "min_hops": 4, "max_hops": 5,
                                              "call_cost": 0.05},
        "context": {"operator": "compaction"}}))
    assert run_label(run) == "focus on search, 4-5 hops, compaction, 0.05/call, seed 2"
    assert run_label(tmp_path / "missing") == "missing"
