"""FOCUS: tree rollouts, allocation, refined values and credit, and an end-to-end training run."""
from __future__ import annotations


import json
import math
from pathlib import Path

import pytest
import torch

from agentrl_cli import config
from agentrl_cli.errors import ConfigError
from agentrl_cli.credit import focus_gain, refine_values, segment_td_advantages
from agentrl_cli.credit.estimators import ESTIMATORS
from agentrl_cli.credit.focus_credit import (FocusTree, FocusTrees, focus_segment_advantages, path_credit,
                                            path_returns, path_values, path_values_loo,
                                            refine_tree, segment_returns, subtree_advantages,
                                            tree_prior, tree_values, visit_weights)
from agentrl_cli.engines.hf import HFEngine
from agentrl_cli.engines.base import SamplingParams
from agentrl_cli.rollout import focus as focus_mod
from agentrl_cli.rollout import planner
from agentrl_cli.rollout.controllers import CONTROLLERS, RolloutContext
from agentrl_cli.rollout.runner import run_episodes
from agentrl_cli.rollout.tree import Node, Tree
from agentrl_cli.train.batch import collate, forward

from conftest import MICRO, random_value_head




def _algo(**kw):
    sets = [f"algo.{k}={v}" for k, v in kw.items()]
    return config.load(sets=MICRO + sets, method="focus").algo


def _ctx(micro_policy, algo, group_size=2, batch_size=3, seed=0, critic=None, budget=0):
    model, tok, fmt, spec = micro_policy
    return RolloutContext(HFEngine(model, fmt.pad_id), fmt, spec, SamplingParams(max_new_tokens=8),
                          group_size, 512, batch_size, budget, torch.Generator().manual_seed(seed),
                          algo=algo, critic=critic)


@pytest.fixture(scope="module")
def linear_case(micro_policy):
    """A FOCUS step with branching disabled and the matching lock-step linear rollout."""
    model, tok, fmt, spec = micro_policy
    head = random_value_head(model)
    tasks = spec.tasks("train", 3)
    algo = _algo(focus_roots=2, focus_lam=0, focus_norm="none")   # the paper's TD(0), raw residuals
    res = CONTROLLERS.get("focus").run(_ctx(micro_policy, algo, critic=head), tasks)
    base = planner.seed_base(torch.Generator().manual_seed(0))
    pairs = [(t, g) for g, t in enumerate(tasks) for _ in range(2)]
    gens = [planner.path_generator(base, i) for i in range(len(pairs))]
    ref = run_episodes(HFEngine(model, fmt.pad_id), fmt, spec, pairs, SamplingParams(max_new_tokens=8),
                       512, batch_size=len(pairs), generator=gens)
    return res, ref, head, algo


def test_no_branching_equals_linear_rollout(linear_case):
    res, ref, _, _ = linear_case
    assert res.metrics["focus/continuations"] == 0
    assert len(res.episodes) == len(ref) == 6
    assert sum(e.num_turns for e in ref) > len(ref), "needs multi-turn episodes"
    for a, b in zip(res.episodes, ref):
        assert a.token_ids == b.token_ids
        assert a.response_mask == b.response_mask
        assert a.segment_index == b.segment_index and a.segment_starts == b.segment_starts
        assert (a.reward, a.finish, a.num_tool_calls, a.group) == (b.reward, b.finish, b.num_tool_calls, b.group)
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-5)


def test_no_branching_advantages_are_td0_of_refined_values(linear_case, micro_policy):
    res, ref, head, algo = linear_case
    model, tok, fmt, spec = micro_policy
    batch = collate(res.episodes, fmt.pad_id)
    batch.payload = res.payload
    with torch.no_grad():
        _, values = forward(model, head, batch, 1.0)
    # independent tree: one shared root per task, then a chain per episode; critic from the trainer
    expect = torch.zeros_like(batch.response_mask)
    for g in range(3):
        eps = [(b, e) for b, e in enumerate(ref) if e.group == g]
        parent, leaf, critic, chain = [-1], [None], [float(values[eps[0][0], eps[0][1].segment_starts[0]])], []
        for b, e in eps:
            ids = [0]
            for k in range(1, e.num_turns):
                parent.append(ids[-1]); leaf.append(None); critic.append(float(values[b, e.segment_starts[k]]))
                ids.append(len(parent) - 1)
            parent.append(ids[-1]); leaf.append(e.reward); critic.append(0.0)
            chain.append((b, e, ids))
        _, vt = refine_values(parent, leaf, critic, algo.kappa, algo.gamma)
        for b, e, ids in chain:
            adv = segment_td_advantages([vt[i] for i in ids], e.reward, algo.gamma, 0.0)
            for k, t in enumerate(e.turns):
                expect[b, t.start:t.end] = adv[k]
    credit = ESTIMATORS.get("focus")(batch, algo)
    torch.testing.assert_close(credit.advantages, expect, rtol=0, atol=1e-4)
    # the rollout's critic values are the trainer's values at the boundary positions
    for tree in res.trees:
        for nd in tree.nodes:
            if not nd.terminal:
                assert abs(nd.v - float(values[nd.path, nd.position])) < 1e-4
    # critic targets: G_bar of every non-leaf node, at its boundary position in its own episode
    n_inner = sum(not nd.terminal for t in res.trees for nd in t.nodes)
    assert int(credit.value_mask.sum()) == n_inner
    # with a (nearly) infinitely confident critic V~ = V: plain segment TD(0) on the critic
    for tree in res.trees:
        arr = tree.arrays()
        vals = refine_tree(arr, kappa=1e9, gamma=1.0)
        for pid in tree.paths:
            e = res.episodes[pid]
            v = [tree.nodes[i].v for i in tree.paths[pid][:-1]]
            got = segment_td_advantages(path_values(arr, vals, pid), e.reward, 1.0, 0.0)
            want = [(e.reward if k == len(v) - 1 else v[k + 1]) - v[k] for k in range(len(v))]
            assert got == pytest.approx(want, abs=1e-6)


def test_allocator_respects_inflight_cap_and_capacity(micro_policy, monkeypatch):
    model, tok, fmt, spec = micro_policy
    seen = {"max_active": 0, "max_own": 0, "forks": 0, "prefills": 0}
    orig_fill, orig_launch = focus_mod.FocusRunner._fill, focus_mod.FocusRunner._launch_from

    def fill(self):
        orig_fill(self)
        seen["max_active"] = max(seen["max_active"], len(self.active))
        own = max(nd.own_inflight for t in self.trees for nd in t.nodes)
        seen["max_own"] = max(seen["max_own"], own)
        for t in self.trees:  # in-flight counts match the running paths
            for nd in t.nodes:
                # own-sample evidence: a running path counts at the node it was launched from
                # and at the nodes it created
                assert nd.inflight == sum(nd.id in p.nodes and (nd.id == p.origin or nd.path == p.pid)
                                          for p in self.active if p.tree is t)
                assert nd.own_inflight == sum(p.origin == nd.id and p.continuation
                                              for p in self.active if p.tree is t)

    def launch(self, plan, node):
        n_rows = self.kv.n
        orig_launch(self, plan, node)
        p = self.paths[-1]
        seen["forks" if p.feed == [] else "prefills"] += 1
        assert self.kv.n == n_rows + 1

    monkeypatch.setattr(focus_mod.FocusRunner, "_fill", fill)
    monkeypatch.setattr(focus_mod.FocusRunner, "_launch_from", launch)
    tasks = spec.tasks("train", 2)
    algo = _algo(focus_roots=1, focus_max_inflight=2)
    res = CONTROLLERS.get("focus").run(_ctx(micro_policy, algo, group_size=5, batch_size=2,
                                        critic=random_value_head(model)), tasks)
    assert seen["max_active"] <= 2 and seen["max_own"] <= 2
    assert len(res.episodes) == 10 and res.metrics["focus/continuations"] == 8
    assert seen["forks"] > 0
    m = res.metrics     # the step reports how its continuations got their prefix
    assert (m["focus/fork_starts"], m["focus/prefill_starts"]) == (seen["forks"], seen["prefills"])
    assert m["focus/fork_starts"] + m["focus/prefill_starts"] == m["focus/continuations"]
    assert (m["focus/prefill_start_tokens"] > 0) == (seen["prefills"] > 0)
    # every continuation resumes exactly its source's prefix; engine log-probs of the new tokens
    # (decoded on forked / compacted / re-prefilled KV rows) agree with a full forward pass
    assert [e.meta.focus_path for e in res.episodes] == list(range(10))
    # each continuation's outcome against the path that first reached its origin state
    by_group = {t.group: t for t in res.trees}
    agree = [e.reward == res.episodes[by_group[e.meta.focus_tree].nodes[e.meta.focus_origin].path].reward
             for e in res.episodes if e.meta.focus_path != by_group[e.meta.focus_tree].nodes[0].path]
    assert len(agree) == 8 and m["focus/continuation_agreement"] == pytest.approx(sum(agree) / 8)
    assert "focus/root_agreement" not in m           # one root a tree: no pair to compare
    branched = {e.meta.focus_tree for e in res.episodes
                if e.meta.focus_path != by_group[e.meta.focus_tree].nodes[0].path}
    assert m["focus/unbranched_trees"] == pytest.approx(1 - len(branched) / 2)
    batch = collate(res.episodes, fmt.pad_id)
    with torch.no_grad():
        lp, _ = forward(model, None, batch, 1.0)
    mask = batch.response_mask.bool()
    assert float((lp - batch.engine_logprobs)[mask].abs().max()) < 1e-4
    trees = res.trees
    for tree in trees:
        for pid, ids in tree.paths.items():
            e = res.episodes[pid]
            for i in ids[:-1]:
                nd = tree.nodes[i]
                src = res.episodes[nd.path]
                assert e.token_ids[:nd.position] == src.token_ids[:nd.position]
            # each segment is trained once: policy tokens only after the path's origin
            origin = tree.nodes[e.meta.focus_origin]
            assert all(m == 0 for m in e.response_mask[:origin.position])
    from agentrl_cli.registry import RegistryError
    from agentrl_cli.app.preflight import check_names

    with pytest.raises(RegistryError, match="unknown focus allocator 'bogus'"):
        check_names(config.load(method="focus", sets=["algo.focus_allocator=bogus"]))
    with pytest.raises(ConfigError, match="algo.focus_gain must be one of plugin, bayes"):
        check_names(config.load(method="focus", sets=["algo.focus_gain=bogus"]))


def test_token_budget_and_other_allocators(micro_policy):
    model, tok, fmt, spec = micro_policy
    tasks = spec.tasks("train", 1)
    for name in ("uniform", "random", "raw-residual"):
        res = CONTROLLERS.get("focus").run(_ctx(micro_policy, _algo(focus_allocator=name, focus_roots=1),
                                            group_size=3, batch_size=2), tasks)
        assert len(res.episodes) == 3
        assert res.metrics["focus/continuations"] == 2
    # token budget: roots always run, continuations are charged while in flight, so with 8
    # paths running at once the step still lands within one path (3 turns x 8 tokens) of the
    # budget (charging only finished tokens overshot by 60-95 tokens here)
    two = spec.tasks("train", 2)
    for seed in range(3):
        res = CONTROLLERS.get("focus").run(_ctx(micro_policy, _algo(focus_roots=1), group_size=32,
                                            batch_size=8, budget=100, seed=seed), two)
        m = res.metrics
        assert m["focus/tokens"] == res.tokens
        assert abs(res.tokens - 100) <= 3 * 8
        assert 2 < len(res.episodes) < 64


def test_a_run_that_overshot_its_budget_launches_less(micro_policy):
    """`ctx.carry["focus_spend"]` (the trainer's, from step to step) = [tokens the run's FOCUS
    steps generated, their budgets]: a step launches continuations up to its budget less the
    run's net overshoot so far, plus its net underspend, so the run's total spend meets its
    total budget (`controllers.spend_limit`). Every step adds its own to the sums."""
    model, tok, fmt, spec = micro_policy
    two = spec.tasks("train", 2)

    def step(carry):
        ctx = _ctx(micro_policy, _algo(focus_roots=1), group_size=32, batch_size=8, budget=100,
                   seed=1)
        ctx.carry = carry
        return CONTROLLERS.get("focus").run(ctx, two)

    first = {}
    res = step(first)
    assert first["focus_spend"] == [res.tokens, 100.0]
    overshot = {"focus_spend": [250.0, 200.0]}                # earlier steps: 50 over
    res2 = step(overshot)
    assert overshot["focus_spend"] == [250.0 + res2.tokens, 300.0]
    assert res2.tokens < res.tokens and abs(res2.tokens - 50) <= 3 * 8
    under = {"focus_spend": [150.0, 200.0]}                    # 50 under: spent now
    res3 = step(under)
    assert under["focus_spend"][1] == 300.0 and res3.tokens > res.tokens
    assert abs(res3.tokens - 150) <= 3 * 8


def test_min_depth_keeps_continuations_below_the_shallow_states(micro_policy):
    """`algo.focus_min_depth=k` launches continuations only from states k or more segments deep;
    at 0 the same step launches from the root and the first states too (so the check can fail)."""
    tasks = micro_policy[3].tasks("train", 2)
    shares = {}
    for depth in (0, 2):
        res = CONTROLLERS.get("focus").run(_ctx(micro_policy, _algo(focus_roots=1, focus_min_depth=depth),
                                            group_size=8, batch_size=4), tasks)
        m = res.metrics
        assert m["focus/continuations"] > 0
        shares[depth] = sum(v for k, v in m.items() if k in ("focus/launch_share_depth0",
                                                               "focus/launch_share_depth1"))
        launched = [nd.depth for t in res.trees for nd in t.nodes if nd.launched]
        assert launched and (depth == 0 or min(launched) >= depth)
    assert shares[0] > 0 and shares[2] == 0
    t = _hand_tree()                             # the shared choice: only node 1's depth is 1
    for nd in t.nodes:
        nd.n, nd.resumable = max(nd.n, 1), True
        nd.g = 0.0 if nd.terminal else 0.1
    assert planner.pick_continuation([t], planner.ALLOCATORS.get("focus"), None, 2)[1].id == 0
    assert planner.pick_continuation([t], planner.ALLOCATORS.get("focus"), None, 2, 1)[1].id == 1
    assert planner.pick_continuation([t], planner.ALLOCATORS.get("focus"), None, 2, 2) is None


def test_gains_hand_computed_and_allocator_choice():
    def node(i, v, n, csum, inflight=0, launched=0, reward=None):
        return Node(i, -1 if i == 0 else 0, 0, 10, 0, v=v, n=n, csum=csum, inflight=inflight,
                    launched=launched, reward=reward, resumable=True)

    a = node(0, 0.3, 1, 1.0)                   # kappa 1, n 1, 0/1 outcome: 5 (v - c)^2 / 36
    assert planner.gain(a, 1.0, "plugin") == pytest.approx(5 * 0.49 / 36)
    b = node(1, 0.3, 1, 1.0, inflight=1)       # n_eff = 2: MSE_2(1) - MSE_3(1)
    assert planner.gain(b, 1.0, "plugin") == pytest.approx(0.49 / 9 - 0.49 / 16)
    c = node(2, 0.7, 2, 1.0, inflight=1)       # cbar 0.5, n_eff 3
    mse = lambda n: (0.2 ** 2 + n * 0.25) / (1 + n) ** 2  # noqa: E731
    assert planner.gain(c, 1.0, "plugin") == pytest.approx(mse(3) - mse(4))
    m = (0.7 + 2 * 0.5) / 3                    # bayes: m(1-m) / (kappa + n_eff + 1)^2
    assert planner.gain(c, 1.0, "bayes") == pytest.approx(m * (1 - m) / 25)
    assert planner.gain(node(3, 0.3, 0, 0.0, inflight=1), 1.0, "plugin") == 0.0
    assert planner.gain(node(4, 0.3, 1, 1.0, reward=1.0), 1.0, "plugin") == 0.0
    for nd in (a, b, c):
        nd.g = planner.gain(nd, 1.0, "plugin")
    pick = planner.ALLOCATORS.get
    assert pick("focus")([a, b, c], None) is a
    c.launched, a.launched, b.launched = 0, 2, 1
    assert pick("uniform")([a, b, c], None) is c
    assert pick("raw-residual")([a, b, c], None) is a      # |0.3 - 1| largest
    zero = node(5, 0.5, 2, 1.0)
    zero.g = 0.0
    assert pick("focus")([zero], None) is None


def _hand_tree() -> Tree:
    """root(v .4) -> a(v .6) -> leaves R=1 (path 0) and R=0 (path 1); root -> b(v .2) -> R=1."""
    t = Tree("task", 0)
    t.add(-1, 0, 10, 0, v=0.4)
    t.add(0, 1, 20, 0, v=0.6)
    t.add(1, 2, 30, 0, reward=1.0, n=1, csum=1.0)
    t.add(1, 2, 31, 1, reward=0.0, n=1, csum=0.0)
    t.add(0, 1, 22, 2, v=0.2)
    t.add(4, 2, 40, 2, reward=1.0, n=1, csum=1.0)
    t.paths = {0: [0, 1, 2], 1: [0, 1, 3], 2: [0, 4, 5]}
    return t


def _hand_arrays() -> FocusTree:
    """`_hand_tree` written as the arrays the rollout hands to credit."""
    return FocusTree(parent=[-1, 0, 1, 1, 0, 4], reward=[None, None, 1.0, 0.0, None, 1.0],
                     critic=[0.4, 0.6, None, None, 0.2, None], position=[10, 20, 30, 31, 22, 40],
                     creator=[0, 0, 0, 1, 2, 2], paths={0: [0, 1, 2], 1: [0, 1, 3], 2: [0, 4, 5]})


def test_the_rollout_hands_credit_plain_tree_arrays():
    assert _hand_tree().arrays() == _hand_arrays()


def test_refine_wiring_on_a_hand_tree():
    t = _hand_arrays()
    gamma = 0.9
    vals = refine_tree(t, kappa=1.0, gamma=gamma)
    v1 = (0.6 + 2 * 0.5) / 3
    v4 = (0.2 + 1.0) / 2
    g0 = gamma * (v1 + v4) / 2
    v0 = (0.4 + 2 * g0) / 3
    assert vals.G_bar == pytest.approx([g0, 0.5, None, None, 1.0, None])
    assert vals.V_tilde == pytest.approx([v0, v1, 1.0, 0.0, v4, 1.0])
    assert path_values(t, vals, 0) == pytest.approx([v0, v1])
    adv = focus_segment_advantages([path_values(t, vals, p) for p in (0, 1, 2)], [1.0, 0.0, 1.0],
                                   gamma, 0.0)
    want = [[gamma * v1 - v0, 1 - v1], [gamma * v1 - v0, -v1], [gamma * v4 - v0, 1 - v4]]
    torch.testing.assert_close(adv, torch.tensor(want), rtol=0, atol=1e-6)
    lam = 0.5  # TD(lambda) option
    adv = focus_segment_advantages([path_values(t, vals, 0)], [1.0], gamma, lam)
    d0, d1 = gamma * v1 - v0, 1 - v1
    assert adv[0].tolist() == pytest.approx([d0 + gamma * lam * d1, d1])
    # the critic targets: G_bar of each inner node with children, in the episode that made it
    values, targets, _, _ = path_credit([t], _algo(kappa=1.0, gamma=gamma), 3)
    assert values[1] == pytest.approx([v0, v1])
    assert targets == [[(10, pytest.approx(g0)), (20, pytest.approx(0.5))], [], [(22, 1.0)]]
    row = json.loads(json.dumps(_hand_tree().to_json(vals)))
    assert row["nodes"][1]["n"] == 0 and row["nodes"][2]["cbar"] == 1.0
    assert row["nodes"][0]["G_bar"] == pytest.approx(g0) and row["nodes"][4]["V_tilde"] == pytest.approx(v4)
    assert {"v", "n", "cbar", "g", "G_bar", "V_tilde"} <= set(row["nodes"][0])


def test_evidence_backup_keeps_the_critic_out_of_its_own_targets():
    """`algo.focus_critic_backup=evidence` on `_hand_tree`: the critic's node targets back up the
    tree's outcomes alone (Eq. 1 with kappa = 0), while the policy's values stay refined."""
    t = _hand_arrays()
    gamma = 0.9
    algo = _algo(kappa=1.0, gamma=gamma, focus_critic_backup="evidence")
    values, targets, vals, _ = path_credit([t], algo, 3)
    # node 1: its leaves 1 and 0; node 4: its leaf 1; the root: the mean of the two backed up
    g1, g4 = 0.5, 1.0
    g0 = gamma * (g1 + g4) / 2
    assert targets == [[(10, pytest.approx(g0)), (20, pytest.approx(g1))], [], [(22, g4)]]
    # the critic values move no target: a different critic, the same targets
    t2 = _hand_arrays()
    t2.critic = [0.9, 0.1, None, None, 0.7, None]
    assert path_credit([t2], algo, 3)[1] == targets
    # while the refined (default) targets do move with it, and the policy's values are unchanged
    paper = _algo(kappa=1.0, gamma=gamma)
    assert path_credit([t2], paper, 3)[1] != path_credit([t], paper, 3)[1]
    assert values == path_credit([t], paper, 3)[0]
    assert vals[0].V_tilde == refine_tree(t, kappa=1.0, gamma=gamma).V_tilde
    with pytest.raises(ConfigError, match="focus_critic_backup"):
        _algo(focus_critic_backup="mc")


def test_train_focus_two_steps(tmp_path):
    from agentrl_cli.app.train import train

    cfg = config.load(sets=MICRO + ["train.steps=2", "train.eval_every=0", "train.save_every=0",
                                    "algo.focus_roots=1"], method="focus")
    summary = train(cfg, tmp_path / "run", log=lambda s: None)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert len(steps) == 2 and summary["steps"] == 2
    for r in steps:
        assert math.isfinite(r["loss/policy"]) and math.isfinite(r["loss/critic"])
        assert r["focus/nodes"] > 0 and r["focus/continuations"] >= 1
        assert r["rollout/tokens"] == r["focus/tokens"]
        for k in ("focus/abs_v_minus_cbar", "focus/critic_mse", "focus/tool_calls_per_episode",
                  "focus/branch_token_share"):
            assert math.isfinite(r[k])


def test_rollout_cli_writes_trees(tmp_path):
    from typer.testing import CliRunner

    from agentrl_cli.cli.main import app

    out = tmp_path / "trees.jsonl"
    args = ["rollout", "--method", "focus", "--out", str(out), "--n", "4", "-g", "2"]
    for s in MICRO:
        args += ["--set", s]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    trees = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(trees) == 4                   # --n counts trees, one per task
    assert len({t["task_id"] for t in trees}) == 4
    for t in trees:
        assert t["nodes"][0]["parent"] == -1 and len(t["paths"]) >= 2
        assert set(t["episodes"]) == set(t["paths"])
        assert all({"v", "n", "cbar", "g", "G_bar", "V_tilde"} <= set(nd) for nd in t["nodes"])


def test_rollout_cli_trees_use_the_warm_critic_and_own_sample_counts(tmp_path, micro_policy):
    """`agentrl rollout --method focus` on a model folder with a fitted value head starts from
    that head (as `train` does), applies the recipe's matched budget, and writes trees whose
    counts are own samples: every inner node n == 1 + launched (the root: roots + launched)."""
    import shutil

    from safetensors.torch import save_file
    from typer.testing import CliRunner

    from agentrl_cli.cli.main import app
    from agentrl_cli.models.loading import model_path
    from agentrl_cli.models.tiny import VALUE_HEAD

    folder = tmp_path / "model"
    shutil.copytree(model_path(config.load(sets=MICRO)), folder)
    hidden = micro_policy[0].config.hidden_size
    save_file({"weight": torch.zeros(1, hidden), "bias": torch.tensor([0.3])}, str(folder / VALUE_HEAD))
    out = tmp_path / "trees.jsonl"
    args = ["rollout", "--method", "focus", "--model", str(folder), "--out", str(out), "--n", "4",
            "--seed", "1"]
    for s in MICRO + ["rollout.max_new_tokens=6", "rollout.group_size=6"]:
        args += ["--set", s]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "value head starts from" in r.output and "budget: " in r.output
    trees = [json.loads(x) for x in out.read_text().splitlines()]
    launched = 0
    for t in trees:
        assert t["question"] and t["gold_answer"]
        roots = sum(1 for nd in t["nodes"] if nd["parent"] == 0 and nd["path"] < 8)
        for nd in t["nodes"]:
            if nd["reward"] is None:
                assert nd["v"] == pytest.approx(0.3, abs=1e-6)      # the warm head, not 0.5
                own = nd["n"] - nd["launched"]
                assert own == 1 or (nd["id"] == 0 and own >= 1), nd
                launched += nd["launched"]
            else:
                assert "model_answer" in nd
    assert launched > 0, "the matched budget must leave room to branch"


def test_budget_match_caps_a_step_at_a_linear_step_of_the_base():
    """`rollout.budget_match` (the focus recipe's default): with no explicit budget, a step may
    generate what a linear step of the base policy generated on step 1's tasks (measured at step
    0); a run saved before that was recorded predicts it from the base check's tokens per
    question; an explicit `rollout.budget_tokens` wins; other recipes have no cap."""
    from agentrl_cli.rollout.matched_budget import step_budget

    base = {"tokens_per_question": 38.5, "linear_step_tokens": 2663}
    focus = config.load(method="focus", sets=["rollout.tasks_per_step=8", "rollout.group_size=8"])
    assert focus.rollout.budget_match is True
    assert step_budget(focus, base) == 2663
    assert step_budget(focus, {"tokens_per_question": 38.5}) == 2464
    pinned = config.load(method="focus", sets=["rollout.budget_tokens=1000"])
    assert step_budget(pinned, base) == 1000
    off = config.load(method="focus", sets=["rollout.budget_match=false"])
    assert step_budget(off, base) == 0
    assert step_budget(config.load(method="grpo"), base) == 0


def test_budget_match_is_what_ablate_measures_for_a_grpo_step(tmp_path):
    """The main command's matched budget and `agentrl ablate`'s are one computation: a focus
    run's budget equals the tokens of the base policy's linear step on step 1's tasks."""
    from agentrl_cli.ablate import budget as ablate
    from agentrl_cli.app.train import train

    sets = [*MICRO, "train.steps=1"]
    cfg = config.load(method="focus", sets=sets)
    summary = train(cfg, tmp_path / "run", log=lambda s: None)
    assert summary["budget_tokens"] == ablate.measure_budget(config.load(method="grpo", sets=sets))
    assert summary["budget_tokens"] > 0


def test_leave_one_out_values_keep_a_path_out_of_its_own_baseline():
    """`algo.focus_baseline=loo` on `_hand_tree`."""
    t = _hand_arrays()
    gamma = 0.9
    vals = refine_tree(t, kappa=1.0, gamma=gamma)
    v4 = (0.2 + 1.0) / 2
    # path 0 (leaf R=1) out: node 1 keeps path 1's leaf (0); node 4 is untouched
    a1 = (0.6 + 0.0) / 2
    a0 = (0.4 + gamma * a1 + gamma * v4) / 3
    assert path_values_loo(t, vals, 0, 1.0, gamma) == pytest.approx([a0, a1])
    # path 2 out: node 4 has no evidence left, so its critic value stands in for it
    v1 = (0.6 + 1.0 + 0.0) / 3
    c0 = (0.4 + gamma * v1 + gamma * 0.2) / 3
    assert path_values_loo(t, vals, 2, 1.0, gamma) == pytest.approx([c0, 0.2])
    # the outcome of a path never moves its own LOO values
    before = path_values_loo(t, vals, 0, 1.0, gamma)
    t.reward[2] = 0.0
    vals = refine_tree(t, kappa=1.0, gamma=gamma)
    assert path_values_loo(t, vals, 0, 1.0, gamma) == pytest.approx(before)
    assert path_values(t, vals, 0) != pytest.approx(before)
    # the estimator's baseline follows algo.focus_baseline
    loo, _, _, _ = path_credit([t], _algo(kappa=1.0, gamma=gamma, focus_baseline="loo"), 3)
    assert loo[0] == pytest.approx(before)


def test_tree_prior_replaces_the_critic_in_the_refined_values():
    """`algo.focus_prior=tree` on `_hand_tree`: every node's V(s) in Eq. 1 is the tree's mean
    reward m = 2/3; with leave-one-out values an unbranched stretch's baseline is m itself."""
    t = _hand_arrays()
    gamma = 0.9
    m = tree_prior(t)
    assert m == pytest.approx(2 / 3)
    vals = refine_tree(t, kappa=1.0, gamma=gamma, prior=m)
    v1 = (m + 2 * 0.5) / 3
    v4 = (m + 1.0) / 2
    v0 = (m + 2 * gamma * (v1 + v4) / 2) / 3
    assert vals.V_tilde == pytest.approx([v0, v1, 1.0, 0.0, v4, 1.0])
    assert tree_values(t, _algo(kappa=1.0, gamma=gamma, focus_prior="tree")).V_tilde == vals.V_tilde
    # path 2 out: node 4 has no evidence left and falls back to the prior, not its critic (0.2)
    v1_all = (m + 1.0 + 0.0) / 3
    assert path_values_loo(t, vals, 2, 1.0, gamma) == pytest.approx(
        [(m + gamma * v1_all + gamma * m) / 3, m])
    vals = refine_tree(t, kappa=1.0, gamma=gamma)      # the critic again: different values
    assert vals.V_tilde[4] == pytest.approx((0.2 + 1.0) / 2)


def test_focus_prior_reaches_the_estimator(micro_policy):
    """Credit refines a rollout's trees with their mean reward when asked."""
    head = random_value_head(micro_policy[0])
    tasks = micro_policy[3].tasks("train", 2)
    algo = _algo(focus_roots=2, focus_prior="tree")
    res = CONTROLLERS.get("focus").run(_ctx(micro_policy, algo, critic=head), tasks)
    values, _, refined, _ = path_credit(res.payload.get(FocusTrees).trees, algo, len(res.episodes))
    moved = False
    for tree, got in zip(res.payload.get(FocusTrees).trees, refined):
        want = refine_tree(tree, algo.kappa, algo.gamma, prior=tree_prior(tree))
        assert got.V_tilde == pytest.approx(want.V_tilde)
        critic = refine_tree(tree, algo.kappa, algo.gamma)   # what the critic prior gives
        moved |= got.V_tilde != pytest.approx(critic.V_tilde)
        for p in tree.paths:
            assert values[p] == path_values(tree, want, p)
    assert moved
    with pytest.raises(ConfigError, match="focus_prior"):
        _algo(focus_prior="mean")


def test_subtree_return_credits_a_shared_segment_with_every_outcome_below_it():
    """`algo.focus_return=subtree` on `_hand_arrays`: path 0's first segment leads to node 1,
    below which paths 0 (R 1) and 1 (R 0) finished, so its target is gamma x 0.5, not its own
    gamma x R; path 2 has no branch below its first state, so its targets equal the path
    return's; with lam = 0 it is the one-step TD residual."""
    t = _hand_arrays()
    gamma = 0.9
    vals = refine_tree(t, kappa=1.0, gamma=gamma)
    evidence = refine_tree(t, kappa=0.0, gamma=gamma)
    v0, v1, v4 = vals.V_tilde[0], vals.V_tilde[1], vals.V_tilde[4]
    assert path_returns(t, vals, evidence, 0, 1.0, gamma) == pytest.approx([gamma * 0.5, 1.0])
    assert path_returns(t, vals, evidence, 1, 1.0, gamma) == pytest.approx([gamma * 0.5, 0.0])
    base = [path_values(t, vals, p) for p in (0, 1, 2)]
    got = subtree_advantages(base, [path_returns(t, vals, evidence, p, 1.0, gamma) for p in (0, 1, 2)])
    want = [[gamma * 0.5 - v0, 1 - v1], [gamma * 0.5 - v0, -v1], [gamma - v0, 1 - v4]]
    torch.testing.assert_close(got, torch.tensor(want), rtol=0, atol=1e-6)
    paper = focus_segment_advantages(base, [1.0, 0.0, 1.0], gamma, 1.0)
    torch.testing.assert_close(got[2], paper[2], rtol=0, atol=1e-6)       # unbranched below
    assert abs(float(got[0, 0] - paper[0, 0])) > 0.4                       # 0.45 vs 0.9
    td0 = [path_returns(t, vals, evidence, p, 0.0, gamma) for p in (0, 1, 2)]
    torch.testing.assert_close(subtree_advantages(base, td0),
                               focus_segment_advantages(base, [1.0, 0.0, 1.0], gamma, 0.0),
                               rtol=0, atol=1e-6)
    with pytest.raises(ConfigError, match="focus_return"):
        _algo(focus_return="mc")


def _mixed_outcome_step(micro_policy, algo):
    """A FOCUS step of the micro policy (3 tasks, 8 paths each) as a training batch, its paths'
    rewards set to 1, 0, 1, ... (trees and batch alike) so the outcomes below a shared state
    differ: -> (rollout result, batch, trees)."""
    model, tok, fmt, spec = micro_policy
    res = CONTROLLERS.get("focus").run(_ctx(micro_policy, algo, group_size=8, batch_size=8,
                                        critic=random_value_head(model)), spec.tasks("train", 3))
    batch = collate(res.episodes, fmt.pad_id)
    batch.payload = res.payload
    trees = res.payload.get(FocusTrees).trees
    for tree in trees:
        for p, ids in tree.paths.items():
            tree.reward[ids[-1]] = float(p % 2 == 0)
            batch.rewards[p] = float(p % 2 == 0)
    return res, batch, trees


def test_focus_return_subtree_reaches_the_estimator(micro_policy):
    """The estimator's advantages with `algo.focus_return=subtree` are the trees' subtree
    targets less the baselines, broadcast to each segment's policy tokens, and differ from the
    path return's on the same trees (the micro policy's paths get rewards 1, 0, 1, ... here so
    that the outcomes below a shared state differ)."""
    algo = _algo(focus_roots=2, focus_lam=1.0)
    res, batch, trees = _mixed_outcome_step(micro_policy, algo)
    assert any(len(t.paths) > len({ids[1] for ids in t.paths.values()}) for t in trees)  # branched
    path = ESTIMATORS.get("focus")(batch, algo).advantages
    sub = _algo(focus_roots=2, focus_lam=1.0, focus_return="subtree")
    got = ESTIMATORS.get("focus")(batch, sub).advantages
    values, _, refined, _ = path_credit(trees, sub, batch.size)
    seg = subtree_advantages(values, segment_returns(trees, refined, sub, batch.size))
    for b, e in enumerate(res.episodes):
        for k, turn in enumerate(e.turns):
            on = batch.response_mask[b, turn.start:turn.end] > 0
            tok_adv = got[b, turn.start:turn.end][on]
            assert torch.allclose(tok_adv, torch.full_like(tok_adv, float(seg[b, k])), atol=1e-6)
    assert not torch.allclose(path, got)


def test_visit_weights_split_each_states_share_among_its_samples():
    """`_hand_arrays`: the root's two children on finished paths get 1/2 each; node 1's two
    leaves 1/4 each (path 1 branched there); node 4's one leaf keeps its 1/2. Every state's
    children weigh what the state does."""
    w = visit_weights(_hand_arrays())
    assert w == {0: [0.5, 0.25], 1: [0.5, 0.25], 2: [0.5, 0.5]}
    t = _hand_arrays()       # a continuation from the root: three children share the root's 1
    t.parent.append(0); t.reward.append(0.0); t.critic.append(None); t.position.append(15)
    t.creator.append(3); t.paths[3] = [0, 6]
    assert visit_weights(t)[3] == [pytest.approx(1 / 3)] and visit_weights(t)[0] == pytest.approx([1 / 3, 1 / 6])


def test_visit_weighting_reaches_the_estimator(micro_policy):
    """`algo.focus_segment_weight=visit` multiplies each segment's advantage by its visit weight,
    rescaled per tree so the tree's policy tokens keep their total weight; the default leaves
    the advantages as they are."""
    algo = _algo(focus_roots=2, focus_lam=1.0)
    res, batch, trees = _mixed_outcome_step(micro_policy, algo)
    plain = ESTIMATORS.get("focus")(batch, algo).advantages
    got = ESTIMATORS.get("focus")(batch, _algo(focus_roots=2, focus_lam=1.0,
                                               focus_segment_weight="visit")).advantages
    mask = (batch.response_mask > 0) & (batch.segment_index >= 0)
    moved = False
    for tree in trees:
        rows = list(tree.paths)
        w = visit_weights(tree)
        factors = []
        for p in rows:                       # (policy tokens, weight) of each trained segment
            for k, turn in enumerate(res.episodes[p].turns):
                on = mask[p, turn.start:turn.end]
                if on.any():
                    factors.append((int(on.sum()), w[p][k]))
        n_tok = sum(n for n, _ in factors)
        scale = n_tok / sum(n * x for n, x in factors)
        for p in rows:
            for k, turn in enumerate(res.episodes[p].turns):
                on = mask[p, turn.start:turn.end]
                a, b = got[p, turn.start:turn.end][on], plain[p, turn.start:turn.end][on]
                torch.testing.assert_close(a, b * w[p][k] * scale, rtol=1e-5, atol=1e-6)
        moved |= len({x for _, x in factors}) > 1
    assert moved and not torch.allclose(got, plain)
    with pytest.raises(ConfigError, match="focus_segment_weight"):
        _algo(focus_segment_weight="count")


def test_focus_baseline_loo_reaches_the_estimator(micro_policy):
    """Credit takes LOO baselines when asked, refined values by default; the rollout does not
    depend on the choice."""
    model, tok, fmt, spec = micro_policy
    head = random_value_head(model)
    tasks = spec.tasks("train", 2)
    got, trees = {}, {}
    for kind in ("refined", "loo"):
        algo = _algo(focus_roots=2, focus_baseline=kind)
        res = CONTROLLERS.get("focus").run(_ctx(micro_policy, algo, critic=head), tasks)
        values, _, refined, _ = path_credit(res.payload.get(FocusTrees).trees, algo, len(res.episodes))
        for tree, vals in zip(res.payload.get(FocusTrees).trees, refined):
            for p in tree.paths:
                assert values[p] == (path_values(tree, vals, p) if kind == "refined" else
                                     path_values_loo(tree, vals, p, algo.kappa, algo.gamma))
        got[kind], trees[kind] = values, res.payload.get(FocusTrees).trees
    assert got["refined"] != got["loo"]
    assert trees["refined"] == trees["loo"]
    with pytest.raises(ConfigError, match="focus_baseline"):
        _algo(focus_baseline="mean")


def _hand_run(rule: str) -> Tree:
    """root -> two root paths (0, 1); continuation 2 from path 0's depth-1 node a; continuation
    3 from node c, which continuation 2 created; continuation 4 from a, still running."""
    t = Tree("task", 0)
    t.add(-1, 0, 10, 0)
    p0 = t.start_path(0, 0, False, rule)
    a = t.grow(0, p0, 1, 20)                       # node 1, created by path 0
    t.land(0, p0, 0, False, 1.0, 2, 30, rule)      # leaf 2
    p1 = t.start_path(1, 0, False, rule)
    t.land(1, p1, 0, False, 0.0, 1, 25, rule)      # leaf 3
    p2 = t.start_path(2, a.id, True, rule)
    c = t.grow(2, p2, 2, 40)                       # node 4, created by continuation 2
    t.land(2, p2, a.id, True, 0.0, 3, 50, rule)    # leaf 5
    p3 = t.start_path(3, c.id, True, rule)         # from a node another continuation created
    t.land(3, p3, c.id, True, 1.0, 3, 55, rule)    # leaf 6
    t.start_path(4, a.id, True, rule)              # in flight
    return t


def test_own_sample_counts_on_a_hand_built_tree():
    t = _hand_run("own")
    root, a, c = t.nodes[0], t.nodes[1], t.nodes[4]
    # root: its two root episodes (1.0, 0.0); nothing was launched from it
    assert (root.n, root.csum, root.inflight, root.launched) == (2, 1.0, 0, 0)
    # a: the path that created it (1.0) and continuation 2 (0.0); continuation 3 landed below
    # a through c (launched from c), so it is not a's own sample; continuation 4 is in flight
    assert (a.n, a.csum, a.inflight, a.launched, a.own_inflight) == (2, 1.0, 1, 2, 1)
    # c: created by continuation 2 (0.0), plus continuation 3 launched from it (1.0)
    assert (c.n, c.csum, c.inflight, c.launched) == (2, 1.0, 0, 1)
    assert c.n == 1 + c.launched and a.n == 1 + (a.launched - a.own_inflight)
    # the in-flight continuation raises a's effective count: n_eff = 3
    a.v = 0.2
    assert planner.gain(a, 1.0, "plugin") == pytest.approx(
        focus_gain(0.2, 2, 0.5, 1.0, n_inflight=1))


def test_subtree_evidence_reproduces_the_old_counts():
    t = _hand_run("subtree")
    root, a, c = t.nodes[0], t.nodes[1], t.nodes[4]
    # every completed leaf below, every running path through
    assert (root.n, root.csum, root.inflight) == (4, 2.0, 1)
    assert (a.n, a.csum, a.inflight) == (3, 2.0, 1)
    assert (c.n, c.csum, c.inflight) == (2, 1.0, 0)


def test_tree_normalisation_centres_and_scales_per_tree():
    from agentrl_cli.credit.focus_credit import tree_normalize

    # tree 0: rewards 1, 0, 0 (std 0.577); tree 1: all 0 (no contrast)
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0])
    group = torch.tensor([0, 0, 0, 1, 1])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 1, 1], [1, 1, 1], [1, 0, 0]], dtype=torch.float32)
    adv = torch.tensor([[0.6, 0.4, 9.0], [-0.3, 9.0, 9.0], [9.0, -0.2, -0.1], [0.5, 0.5, 0.5], [-1.0, 9.0, 9.0]])
    out = tree_normalize(adv, mask, rewards, group)
    tok = [0.6, 0.4, -0.3, -0.2, -0.1]
    mean, sd = sum(tok) / 5, torch.tensor([1.0, 0.0, 0.0]).std().item()
    want0 = [[(0.6 - mean) / sd, (0.4 - mean) / sd, 0], [(-0.3 - mean) / sd, 0, 0], [0, (-0.2 - mean) / sd, (-0.1 - mean) / sd]]
    torch.testing.assert_close(out[:3], torch.tensor(want0), rtol=1e-5, atol=1e-5)
    assert float(out[:3].sum()) == pytest.approx(0.0, abs=1e-5)   # centred on its policy tokens
    assert float(out[3:].abs().sum()) == 0.0                      # no outcome contrast: no signal


def test_contrast_gate_zeroes_only_trees_without_outcome_contrast():
    from agentrl_cli.credit.focus_credit import contrast_gate

    # tree 0: rewards 1, 0, 0 (mixed: kept raw); tree 1: all 0; tree 2: all 1 (both zeroed)
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    group = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    adv = torch.tensor([[0.6, 0.4], [-0.3, -0.2], [-0.1, -0.5], [-0.2, -0.2], [-0.3, 0.0],
                        [0.1, 0.2], [0.3, 0.0]])
    out = contrast_gate(adv, rewards, group)
    torch.testing.assert_close(out[:3], adv[:3])                  # no centring, no scaling
    assert float(out[3:].abs().sum()) == 0.0
    # the option's values: an unknown one is a config error, contrast is accepted
    with pytest.raises(ConfigError, match="focus_norm"):
        _algo(focus_norm="gate")
    assert _algo(focus_norm="contrast").focus_norm == "contrast"


def test_focus_norm_contrast_reaches_the_estimator(micro_policy):
    """With focus_norm=contrast the credit equals the raw credit on a tree with outcome contrast
    and is 0 on every path of an all-fail tree, where the raw credit pushes every call down."""
    algo = _algo(focus_roots=2, focus_lam=1.0)
    res, batch, trees = _mixed_outcome_step(micro_policy, algo)
    failed = trees[0]                       # tree 0 fails everywhere, the others stay mixed
    for p, ids in failed.paths.items():
        failed.reward[ids[-1]] = 0.0
        batch.rewards[p] = 0.0
    raw = ESTIMATORS.get("focus")(batch, algo).advantages
    got = ESTIMATORS.get("focus")(batch, _algo(focus_roots=2, focus_lam=1.0,
                                               focus_norm="contrast")).advantages
    rows = list(failed.paths)
    others = [b for b in range(batch.size) if b not in rows]
    assert float(raw[rows].min()) < 0.0                   # the raw credit: -V~ on the calls
    assert float(got[rows].abs().sum()) == 0.0
    torch.testing.assert_close(got[others], raw[others])
    assert float(got[others].abs().sum()) > 0.0


def test_token_critic_targets_put_each_segments_next_refined_value_on_its_tokens():
    from agentrl_cli.credit.focus_credit import with_token_targets

    # one path, 3 segments: V~ = [0.4, 0.6, 0.9], R = 1; tokens 0-1 prompt, then segments 0,1,2
    # (segment 1 inherited: no policy tokens), a node boundary target at position 2 (G_bar 0.7)
    seg = torch.tensor([[-1, -1, 0, 0, 1, 1, 2, 2]])
    resp = torch.tensor([[0, 0, 1, 1, 0, 0, 1, 1]], dtype=torch.float32)
    returns = torch.zeros(1, 8)
    mask = torch.zeros(1, 8)
    returns[0, 2], mask[0, 2] = 0.7, 1.0
    r, m = with_token_targets(returns, mask, [[0.4, 0.6, 0.9]], [1.0], 1.0, seg, resp)
    torch.testing.assert_close(r, torch.tensor([[0, 0, 0.7, 0.6, 0, 0, 1.0, 1.0]]))
    torch.testing.assert_close(m, torch.tensor([[0, 0, 1.0, 1.0, 0, 0, 1.0, 1.0]]))
    # gamma discounts the next node's value, not the reward
    r, _ = with_token_targets(torch.zeros(1, 8), torch.zeros(1, 8), [[0.4, 0.6, 0.9]], [1.0], 0.5, seg, resp)
    torch.testing.assert_close(r[0, 2:4], torch.tensor([0.3, 0.3]))


def test_outcome_agreement_compares_continuations_with_their_origin_path_and_roots_in_pairs():
    """A continuation counts as agreeing when its reward equals that of the path that first
    reached its origin state (not the tree's first path); roots are compared in pairs within
    their own tree only."""
    from types import SimpleNamespace
    from agentrl_cli.rollout.planner import PlanPath, outcome_agreement

    t, u = Tree("a", 0), Tree("b", 1)
    t.add(-1, 0, 10, 0)                    # node 0: the root, first reached by path 0
    t.add(0, 1, 20, 1)                     # node 1: first reached by path 1
    u.add(-1, 0, 10, 4)
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    spec = [(t, 0, False), (t, 0, False), (t, 1, True), (t, 1, True), (u, 0, False), (u, 0, False)]
    paths = [PlanPath(i, tree, SimpleNamespace(reward=r), [], origin, cont)
             for i, (r, (tree, origin, cont)) in enumerate(zip(rewards, spec))]
    got = outcome_agreement(paths)
    # paths 2 and 3 start at node 1, first reached by path 1 (reward 0): one of two agrees
    assert got["focus/continuation_agreement"] == pytest.approx(0.5)
    # root pairs: (0, 1) in tree a differ, (4, 5) in tree b agree; never across trees
    assert got["focus/root_agreement"] == pytest.approx(0.5)
    assert outcome_agreement(paths[:1]) == {}


def test_critic_rank_orders_the_states_by_their_outcomes():
    """focus/critic_rank is Spearman's rho between V(s) and cbar(s) over the step's
    non-terminal states with both; leaves, unvisited states and states without a value are
    left out; it is undefined (None) for fewer than two states or a constant side."""
    from agentrl_cli.rollout.planner import critic_rank

    def tree(values_and_outcomes):
        t = Tree("task", 0)
        t.add(-1, 0, 10, 0)                                   # a root without a value
        for i, (v, n, csum) in enumerate(values_and_outcomes):
            t.add(0, 1, 20 + i, i, v=v, n=n, csum=csum)
        t.add(0, 1, 90, 9, reward=1.0, n=1, csum=1.0)          # a leaf: not a state
        t.add(0, 1, 91, 9, v=0.9, n=0)                          # never completed: left out
        return t

    same = tree([(0.1, 2, 0.0), (0.5, 2, 1.0), (0.9, 2, 2.0)])
    assert critic_rank([same]) == pytest.approx(1.0)
    reversed_ = tree([(0.9, 2, 0.0), (0.5, 2, 1.0), (0.1, 2, 2.0)])
    assert critic_rank([reversed_]) == pytest.approx(-1.0)
    # over the step's trees together: 4 states, one pair out of order
    assert critic_rank([same, tree([(0.2, 4, 3.0)])]) == pytest.approx(0.8)
    assert critic_rank([tree([(0.3, 1, 1.0)])]) is None                 # one state
    assert critic_rank([tree([(0.3, 2, 1.0), (0.7, 2, 1.0)])]) is None  # outcomes constant
