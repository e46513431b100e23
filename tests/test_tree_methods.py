"""The tree methods beside FOCUS on the same tree engine: Tree-GRPO's credit (`tree_grpo`),
the entropy allocator (TreeRL / ARPO) and the oracle rung of FOCUS's critic ladder, each
checked on hand-built trees against its paper's rule."""
from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from agentrl_cli import config
from agentrl_cli.credit import tree_grpo
from agentrl_cli.credit.estimators import ESTIMATORS
from agentrl_cli.credit.focus_credit import FocusTree, FocusTrees
from agentrl_cli.engines.base import SamplingParams
from agentrl_cli.engines.hf import HFEngine
from agentrl_cli.envs.base import make_env_spec
from agentrl_cli.errors import ConfigError
from agentrl_cli.rollout import planner
from agentrl_cli.rollout.controllers import CONTROLLERS, RolloutContext
from agentrl_cli.rollout.tree import Node, Tree
from agentrl_cli.train.batch import collate
from agentrl_cli.types import Episode, Payload

from conftest import MICRO


def _forest() -> FocusTree:
    """A task's forest: root 0; chain A (path 0: 0-1-2-L3) with a continuation from node 1
    (path 1: 1-4-L5) and one from node 2 (path 2: 2-L6); chain B (path 3: 0-7-L8).
    Rewards: path 0 -> 1, path 1 -> 0, path 2 -> 1, path 3 -> 0."""
    parent = [-1, 0, 1, 2, 1, 4, 2, 0, 7]
    reward = [None, None, None, 1.0, None, 0.0, 1.0, None, 0.0]
    paths = {0: [0, 1, 2, 3], 1: [0, 1, 4, 5], 2: [0, 1, 2, 6], 3: [0, 7, 8]}
    return FocusTree(parent=parent, reward=reward, critic=[0.5] * 9, position=list(range(9)),
                     creator=[0, 0, 0, 0, 1, 1, 2, 3, 3], paths=paths)


def _rel(xs):
    m = sum(xs) / len(xs)
    sd = (sum((x - m) ** 2 for x in xs) / len(xs)) ** 0.5
    return [(x - m) / (sd + tree_grpo.EPS) for x in xs]


def test_tree_grpo_sums_the_intra_tree_and_the_inter_tree_advantage():
    adv = tree_grpo.leaf_advantages(_forest())
    inter = _rel([1.0, 0.0, 1.0, 0.0])                 # all four leaves of the task
    intra_a = _rel([1.0, 0.0, 1.0])                    # chain A's tree: paths 0, 1, 2
    assert adv[0] == pytest.approx(intra_a[0] + inter[0])
    assert adv[1] == pytest.approx(intra_a[1] + inter[1])
    assert adv[2] == pytest.approx(intra_a[2] + inter[2])
    assert adv[3] == pytest.approx(0.0 + inter[3])    # chain B's tree has one leaf: intra 0
    assert adv[0] > 0 > adv[1] and adv[3] < 0


def test_tree_grpo_gives_a_shared_segment_the_mean_of_the_leaves_below_it():
    adv = tree_grpo.leaf_advantages(_forest())
    seg = tree_grpo.segment_advantages([_forest()], 4)
    # path 0's first segment leads to node 1, which paths 0, 1, 2 pass through
    assert seg[0, 0].item() == pytest.approx((adv[0] + adv[1] + adv[2]) / 3)
    # its second leads to node 2 (paths 0 and 2), its third to its own leaf
    assert seg[0, 1].item() == pytest.approx((adv[0] + adv[2]) / 2)
    assert seg[0, 2].item() == pytest.approx(adv[0])
    # path 1's segment from node 1 to node 4: only its own leaf below
    assert seg[1, 1].item() == pytest.approx(adv[1])
    assert seg[3, :2].tolist() == pytest.approx([adv[3], adv[3]])


def _episode(rows: list[tuple[int, float]], reward: float) -> Episode:
    """An episode of prompt tokens (mask 0) then turns of (token count, log-prob)."""
    ids, mask, lps, turn, seg, starts = [1, 2], [0, 0], [0.0, 0.0], [-1, -1], [-1, -1], []
    for k, (n, lp) in enumerate(rows):
        starts.append(len(ids))
        ids += [5] * n
        mask += [1] * n
        lps += [lp] * n
        turn += [k] * n
        seg += [k] * n
    return Episode("t", 0, ids, mask, lps, turn, starts, segment_index=seg, reward=reward)


def test_the_tree_grpo_estimator_puts_segment_advantages_on_their_tokens():
    eps = [_episode([(2, -1.0), (3, -1.0)], 1.0), _episode([(2, -1.0)], 0.0)]
    tree = FocusTree(parent=[-1, 0, 1, 0], reward=[None, None, 1.0, 0.0], critic=[0.5] * 4,
                     position=[2, 4, 7, 4], creator=[0, 0, 0, 1], paths={0: [0, 1, 2], 1: [0, 3]})
    batch = collate(eps, pad_id=0)
    batch.payload.add(FocusTrees([tree]))
    credit = ESTIMATORS.get("tree_grpo")(batch, config.load(method="tree_grpo").algo)
    a = tree_grpo.leaf_advantages(tree)
    assert credit.advantages[0, 2:7].tolist() == pytest.approx([a[0]] * 5)
    assert credit.advantages[1, 2:4].tolist() == pytest.approx([a[1]] * 2)
    assert credit.advantages[:, :2].abs().sum() == 0       # prompt tokens carry nothing
    batch.payload = Payload()
    with pytest.raises(ValueError, match="trees"):
        ESTIMATORS.get("tree_grpo")(batch, config.load(method="tree_grpo").algo)


def _node(i, h, launched=0, depth=1):
    nd = Node(i, 0, depth, 10 * i, 0, n=1)
    nd.h, nd.launched = h, launched
    return nd


def test_the_entropy_allocator_takes_the_most_surprised_state_of_the_least_launched():
    pick = planner.ALLOCATORS.get("entropy")
    ctx = planner.AllocatorContext(None, random.Random(0), [])
    a, b, c = _node(1, 0.4), _node(2, 1.7), _node(3, 0.9)
    assert pick([a, b, c], ctx) is b
    b.launched = 1                          # b took this round's continuation: next, c
    assert pick([a, b, c], ctx) is c
    a.launched = c.launched = 1             # a new round: b again
    assert pick([a, b, c], ctx) is b
    d = _node(4, None)                      # no surprisal measured yet: last
    assert pick([d, _node(5, 0.1)], ctx).h == 0.1


def test_turn_surprisal_is_the_mean_negative_log_prob_of_the_turn_from_the_state():
    ep = _episode([(2, -1.0), (4, -0.5)], 1.0)
    tree = Tree("t", 0)
    root = tree.add(-1, 0, 2, 0)
    mid = tree.add(root.id, 1, 4, 0)
    leaf = tree.add(mid.id, 2, 8, 0, reward=1.0)
    planner.turn_surprisal(tree, [root.id, mid.id, leaf.id], ep)
    assert root.h == pytest.approx(1.0) and mid.h == pytest.approx(0.5)
    branch = _episode([(2, 0.0), (4, -2.0)], 0.0)
    branch.response_mask[2:4] = [0, 0]      # an inherited prefix: no log-probs of its own
    other = tree.add(mid.id, 2, 8, 1, reward=0.0)
    planner.turn_surprisal(tree, [root.id, mid.id, other.id], branch)
    assert root.h == pytest.approx(1.0) and mid.h == pytest.approx(0.5)   # first one kept


# ------------------------------------------------------------------ the oracle rung
def _allocation_ctx(micro_policy, critic_rung: str, seed: int = 0):
    model, tok, fmt, _ = micro_policy
    cfg = config.load(sets=MICRO + ["env.name=allocation", "env.max_turns=6", f"algo.focus_critic={critic_rung}"],
                      method="focus")
    spec = make_env_spec(cfg.env)
    return RolloutContext(HFEngine(model, fmt.pad_id), fmt, spec, SamplingParams(max_new_tokens=8),
                          2, 512, 3, 0, torch.Generator().manual_seed(seed), algo=cfg.algo), spec


def test_the_oracle_rung_gives_every_state_the_envs_own_value(micro_policy):
    ctx, spec = _allocation_ctx(micro_policy, "oracle")
    res = CONTROLLERS.get("focus").run(ctx, spec.tasks("train", 2))
    inner = [nd for t in res.trees for nd in t.nodes if not nd.terminal and nd.snapshot is not None]
    assert inner
    for nd in inner:
        env = spec.make()
        env.restore(nd.snapshot)
        assert nd.v == env.oracle_value()
    # the learned rung reads the critic instead (none here: the untrained 0.5 of no critic)
    ctx, spec = _allocation_ctx(micro_policy, "learned")
    res = CONTROLLERS.get("focus").run(ctx, spec.tasks("train", 2))
    values = {nd.v for t in res.trees for nd in t.nodes if not nd.terminal and nd.v is not None}
    assert values <= {0.5}


def test_the_oracle_rung_needs_an_env_that_computes_it():
    from agentrl_cli.app.preflight import check_names

    cfg = config.load(sets=MICRO + ["algo.focus_critic=oracle"], method="focus")   # search
    with pytest.raises(ConfigError, match="oracle_value"):
        check_names(cfg)
    check_names(config.load(sets=MICRO + ["env.name=allocation", "env.max_turns=6", "algo.focus_critic=oracle"],
                            method="focus"))


# ------------------------------------------------------------------ the cold and pretrained rungs
def test_the_cold_and_pretrained_rungs_start_the_critic_as_they_say(tmp_path):
    """The shipped allocation agent carries a head fitted on its base policy's Monte-Carlo
    returns: learned and pretrained start from it, cold leaves it out; pretrained on a folder
    without one is a one-line error, never a silent cold start."""
    from safetensors.torch import load_file

    from agentrl_cli.models.tiny import VALUE_HEAD
    from agentrl_cli.train.learner import initial_critic
    from agentrl_cli.app.preflight import load_config
    from agentrl_cli.app.tiny_build import load_policy

    def critic(rung, path=None):
        cfg = load_config(None, [f"algo.focus_critic={rung}"], "allocation-early", method="focus")
        model, _, _, found = load_policy(cfg, log=lambda s: None)
        said = []
        c = initial_critic(cfg, model, str(path or found), said.append)
        return c, said, Path(found)

    learned, said, folder = critic("learned")
    fitted = load_file(str(folder / VALUE_HEAD))
    assert torch.equal(learned.weight, fitted["weight"]) and any("starts from" in s for s in said)
    pretrained, _, _ = critic("pretrained")
    assert torch.equal(pretrained.weight, fitted["weight"])
    cold, said, _ = critic("cold")
    assert not torch.equal(cold.weight, fitted["weight"]) and any("left out" in s for s in said)
    bare = tmp_path / "no-head"
    bare.mkdir()
    for f in folder.iterdir():
        if f.name != VALUE_HEAD:
            (bare / f.name).write_bytes(f.read_bytes())
    with pytest.raises(ConfigError, match="pretrained"):
        critic("pretrained", bare)
    assert not torch.equal(critic("learned", bare)[0].weight, fitted["weight"])   # cold, as before
