"""benchmarks/samples_by_depth.py: how often a step trains each decision of a task, from a run's
saved trees (FOCUS) or episodes (linear methods)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from conftest import complete_tree

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("samples_by_depth", ROOT / "benchmarks" / "samples_by_depth.py")
sbd = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sbd)


def _tree() -> dict:
    """Root path 0: root(0) -> a(1) -> b(2) -> leaf(3); root path 1: root -> c(4) -> leaf(5);
    continuation 2 from b: b -> leaf(6); continuation 3 from a: a -> d(7) -> leaf(8)."""
    parent_path_depth = [(-1, 0, 0), (0, 0, 1), (1, 0, 2), (2, 0, 3), (0, 1, 1), (4, 1, 2),
                         (2, 2, 3), (1, 3, 2), (7, 3, 3)]
    nodes = [{"id": i, "parent": p, "path": path, "depth": d} for i, (p, path, d) in enumerate(parent_path_depth)]
    paths = {"0": [0, 1, 2, 3], "1": [0, 4, 5], "2": [0, 1, 2, 6], "3": [0, 1, 7, 8]}
    return complete_tree({"nodes": nodes, "paths": paths})


def _run(tmp: Path, name: str, method: str, trace: dict) -> Path:
    run = tmp / name
    (run / "traces").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"method": method, "rollout": {"group_size": 8}}))
    (run / "traces" / "step-000001.json").write_text(json.dumps({"step": 1, **trace}))
    return run


def test_a_tree_trains_each_segment_once_on_the_path_that_made_it(tmp_path, capsys):
    # depth 0: paths 0 and 1 (the root's two children); depth 1: 0 (a->b), 1 (c->leaf),
    # 3 (a->d); depth 2: 0 (b->leaf), 2 (b->leaf), 3 (d->leaf); inherited segments not counted
    assert sbd.tree_counts(_tree())[:4] == [2, 3, 3, 0]
    focus = _run(tmp_path, "f", "focus", {"trees": [_tree(), _tree()]})
    # a linear step: 4 sampled episodes of 1, 2, 2 and 3 segments, 8 per task
    eps = [{"turns": [{}] * n, "tokens": [], "response_mask": [], "advantages": []}
           for n in (1, 2, 2, 3)]
    grpo = _run(tmp_path, "g", "grpo", {"episodes": eps, "episodes_in_step": 64})
    f, g = sbd.run_counts(focus, 1, 10), sbd.run_counts(grpo, 1, 10)
    assert f["counts"][:4] == [2.0, 3.0, 3.0, 0.0]
    assert g["counts"][:4] == pytest.approx([8.0, 6.0, 2.0, 0.0])
    sbd.main([str(grpo), str(focus), "--json", str(tmp_path / "o.json")])
    out = capsys.readouterr().out
    assert "| `grpo` | 1 | 8.0 | 6.0 | 2.0 |" in out and "| `focus` | 1 | 2.0 | 3.0 | 3.0 |" in out
    with pytest.raises(SystemExit, match="no saved steps"):
        sbd.run_counts(focus, 2, 10)
