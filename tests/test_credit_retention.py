"""benchmarks/credit_retention.py: the share of a segment's own consequences its FOCUS credit
keeps, per baseline setting, on a hand tree whose refined values are worked out below."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from conftest import complete_tree

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("credit_retention", ROOT / "benchmarks" / "credit_retention.py")
cr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cr)


def _saved_tree() -> dict:
    """root(0) -> a(1) -> leaves 2 (path 0, R 1) and 3 (path 1, a continuation from a, R 0);
    root -> b(4) -> leaf 5 (path 2, R 1). Critic 0.4 / 0.6 / 0.2 at the root, a, b."""
    rows = [(-1, None, 0.4, 0, 10), (0, None, 0.6, 0, 20), (1, 1.0, None, 0, 30),
            (1, 0.0, None, 1, 31), (0, None, 0.2, 2, 22), (4, 1.0, None, 2, 40)]
    nodes = [{"id": i, "parent": p, "reward": r, "v": v, "path": path, "position": pos}
             for i, (p, r, v, path, pos) in enumerate(rows)]
    return complete_tree({"nodes": nodes, "paths": {"0": [0, 1, 2], "1": [0, 1, 3], "2": [0, 4, 5]}})


def _algo(baseline: str, prior: str = "critic"):
    from types import SimpleNamespace
    return SimpleNamespace(kappa=1.0, gamma=1.0, focus_baseline=baseline, focus_prior=prior)


def test_retention_on_a_hand_tree(tmp_path, capsys):
    tree = cr.focus_tree(_saved_tree())
    # refined values (kappa 1): V~(a) = (0.6 + R2 + R3) / 3, V~(b) = (0.2 + R5) / 2,
    # V~(root) = (0.4 + V~(a) + V~(b)) / 3. Raising both leaves below a moves V~(root) by
    # (2/3) / 3: path 0's first segment keeps 7/9; its second (a -> leaf 2) 1 - 1/3; path 1's
    # own segment (a -> leaf 3) 2/3; path 2: 1 - (1/2) / 3 and 1 - 1/2. Path 1's first
    # segment is path 0's, not counted again.
    got = [r for _, r in cr.retention(tree, _algo("refined"))]
    assert got == pytest.approx([7 / 9, 2 / 3, 2 / 3, 5 / 6, 1 / 2])
    # leave-one-out: a path's own leaf is out of its baseline, its sibling's is not: path 0's
    # first segment sees leaf 3 through V~_-(a) = (0.6 + R3) / 2, so it keeps 1 - (1/2) / 3
    loo = [r for _, r in cr.retention(tree, _algo("loo"))]
    assert loo == pytest.approx([5 / 6, 1.0, 1.0, 1.0, 1.0])
    assert [n for n, _ in cr.retention(tree, _algo("loo"))] == [10, 10, 11, 12, 18]
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"algo": {"kappa": 1.0, "gamma": 1.0}}))
    (run / "traces" / "step-000001.json").write_text(json.dumps({"step": 1, "trees": [_saved_tree()]}))
    info = cr.run_retention(run)
    weights = [10, 10, 11, 12, 18]
    assert info["refined"] == pytest.approx(sum(w * r for w, r in zip(weights, got)) / sum(weights))
    assert info["loo"] > info["refined"] and info["prior=tree"] < info["refined"]
    cr.main([str(run)])
    assert f"| {run.parent.name}/run | 1 | {info['refined']:.2f} | {info['loo']:.2f} |" in capsys.readouterr().out
