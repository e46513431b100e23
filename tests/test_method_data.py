"""Methods own their data: a method's controller and preparer hand its estimator a typed
payload that the trainer passes through unread; what the parts note on an episode is a typed
`EpisodeMeta`; and no code outside a registration reads a method's or a part's name."""
from __future__ import annotations

import ast
import json
from dataclasses import dataclass, fields
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from agentrl_cli import config
from agentrl_cli.credit.estimators import (ESTIMATORS, Credit, SegmentValues, TraceReference,
                                           reads_values, value_free)
from agentrl_cli.rollout.controllers import CONTROLLERS, Controller, linear
from agentrl_cli.app.train import train as checked_train
from agentrl_cli.train import loop
from agentrl_cli.train.batch import collate, trim
from agentrl_cli.types import Episode, EpisodeMeta, Payload
from conftest import MICRO

PACKAGE = Path(__file__).resolve().parents[1] / "agentrl_cli"


@dataclass
class Marks:
    """A toy method's payload: one number per episode, made by its controller."""

    values: list[float]


def toy_controller(ctx, tasks):
    """GRPO's groups, plus a payload of the toy estimator's own type."""
    res = linear(ctx, tasks)
    res.payload.add(Marks([float(i) for i in range(len(res.episodes))]))
    return res


def test_a_new_method_hands_its_own_payload_through_the_loop(tmp_path, monkeypatch):
    seen = []

    def toy_estimator(batch, algo):
        marks = batch.payload.get(Marks)
        seen.append(marks)
        return Credit(torch.tensor(marks.values)[:, None] * batch.response_mask)

    monkeypatch.setitem(CONTROLLERS._items, "toy_marks", Controller(toy_controller))
    monkeypatch.setitem(ESTIMATORS._items, "toy_marks", toy_estimator)
    cfg = config.load(method="grpo", sets=MICRO + ["train.steps=1", "algo.controller=toy_marks",
                                                   "algo.estimator=toy_marks"])
    checked_train(cfg, tmp_path / "run", log=lambda s: None)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(seen) == 1 and seen[0].values == [0.0, 1.0, 2.0, 3.0]   # 2 tasks x 2 episodes
    assert rows[-1]["step"] == 1 and rows[-1]["adv/mean"] > 0   # the estimator's advantages trained


def _episode(n: int = 4) -> Episode:
    return Episode("t", 0, list(range(1, n + 1)), [0, 1, 1, 0][:n], [0.0] * n, [-1, 0, 0, -1][:n],
                   [1])


def test_the_payload_finds_objects_by_type_and_travels_with_the_batch():
    ref = TraceReference(torch.ones(2, 3), torch.tensor([1, 2]))
    vals = SegmentValues([[0.5], [0.25]], [[3], [3]])
    batch = collate([_episode(), _episode(3)], pad_id=0, payload=Payload(vals))
    batch.payload.add(ref)                                  # a preparer's addition
    assert batch.payload.get(SegmentValues) is vals and batch.payload.get(TraceReference) is ref
    assert batch.payload.get(Marks) is None
    with pytest.raises(ValueError, match="already holds a SegmentValues"):
        batch.payload.add(SegmentValues([], []))
    part = trim(batch.select([1]))
    assert part.payload is batch.payload                    # micro-batches keep it whole
    moved = batch.to("meta")
    assert moved.payload.get(TraceReference).mean_logprobs.device.type == "meta"
    assert moved.payload.get(SegmentValues) is vals         # no tensors: the same object
    assert len(collate([_episode()], pad_id=0).payload) == 0


def test_the_per_method_fields_are_gone_from_the_shared_types():
    from agentrl_cli.rollout.controllers import RolloutResult
    from agentrl_cli.train.batch import Batch

    for cls in (RolloutResult, Batch):
        names = {f.name for f in fields(cls)}
        assert "payload" in names
        assert not names & {"tree_arrays", "segment_values", "segment_counts", "trace_reference"}


def test_episode_meta_declares_every_key_and_rejects_others():
    ep = _episode()
    ep.meta.focus_path = 3
    with pytest.raises(AttributeError):
        ep.meta.focus_pth = 3                               # a typo is an error, not a new key
    with pytest.raises(TypeError):
        EpisodeMeta(reward_shaped=1.0)
    with pytest.raises(TypeError):
        ep.meta["focus_path"]
    ep.meta.rewards = {"length": 0.5}
    assert ep.to_json()["meta"] == {"rewards": {"length": 0.5}, "focus_path": 3}
    kept = ep.meta.cleared(EpisodeMeta.PATH)
    assert kept.focus_path is None and kept.rewards == {"length": 0.5} and ep.meta.focus_path == 3
    declared = {f.name for f in fields(EpisodeMeta)}
    assert set(EpisodeMeta.SHAPED + EpisodeMeta.PATH) <= declared


def _meta_attributes() -> set[str]:
    """Every NAME in `<expr>.meta.NAME` the package reads or writes."""
    out = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "meta"):
                out.add(node.attr)
    return out


def test_every_meta_key_the_package_uses_is_declared():
    allowed = {f.name for f in fields(EpisodeMeta)} | {"cleared", "to_json", "SHAPED", "PATH"}
    allowed |= {"get", "items", "keys"}                     # an env's `Task.meta` is its own dict
    assert _meta_attributes() - allowed == set()


PART_KEYS = {"method", "controller", "estimator", "loss", "focus_allocator"}   # a method's parts


def _name_comparisons() -> list[str]:
    """`x.controller == "focus"`-like comparisons of a part's name with a literal."""
    hits = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            named = any(isinstance(s, ast.Attribute) and s.attr in PART_KEYS for s in sides)
            literal = any(isinstance(s, ast.Constant) and isinstance(s.value, str) or
                          isinstance(s, (ast.Tuple, ast.List, ast.Set)) for s in sides)
            if named and literal:
                hits.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return hits


def test_no_code_branches_on_a_part_name():
    assert _name_comparisons() == []


def test_a_tree_controller_is_known_by_its_capability(monkeypatch, micro_policy):
    """`rollout.focus_tasks=match` applies to any controller that declares `trees`."""
    monkeypatch.setitem(CONTROLLERS._items, "toy_trees",
                        Controller(toy_controller, trees=True))
    for name, per_step in (("toy_trees", 5), ("linear", 2)):
        cfg = config.load(sets=MICRO + [f"algo.controller={name}", "rollout.focus_tasks=match"])
        run = SimpleNamespace(cfg=cfg, base={"matched_tasks": 5}, rt=SimpleNamespace(spec=micro_policy[3]),
                              sampler=SimpleNamespace(per_step=2), log=lambda s: None)
        loop.match_tasks(run)
        assert run.sampler.per_step == per_step


def test_an_estimator_declares_that_it_reads_no_values():
    assert not reads_values(ESTIMATORS.get("focus"))
    assert reads_values(ESTIMATORS.get("gae")) and reads_values(ESTIMATORS.get("mpo"))

    def toy(batch, algo):
        return Credit(batch.response_mask * 0)

    assert reads_values(toy) and not reads_values(value_free(toy))
