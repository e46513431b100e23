"""benchmarks/tree_outcome_info.py: how much a tree's states say about their paths' outcomes
beyond the task, read from a run's saved trees."""
from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

from conftest import complete_tree

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("tree_outcome_info", ROOT / "benchmarks" / "tree_outcome_info.py")
toi = importlib.util.module_from_spec(spec)
spec.loader.exec_module(toi)


def _tree(rng: random.Random, decided_by_state: bool) -> dict:
    """Root -> 3 chains of 4 states -> 2 leaves each (6 paths). The pair of leaves below one
    depth-4 state share its outcome when `decided_by_state`, else each leaf's outcome is a coin."""
    nodes = [{"id": 0, "depth": 0, "reward": None}]
    paths = {}
    for chain in range(3):
        ids = [0]
        for depth in range(1, 5):
            nodes.append({"id": len(nodes), "depth": depth, "reward": None})
            ids.append(len(nodes) - 1)
        outcome = float(rng.random() < 0.5)
        for leaf in range(2):
            r = outcome if decided_by_state else float(rng.random() < 0.5)
            nodes.append({"id": len(nodes), "depth": 5, "reward": r})
            paths[str(2 * chain + leaf)] = ids + [len(nodes) - 1]
    return complete_tree({"nodes": nodes, "paths": paths})


def _run(tmp: Path, name: str, decided_by_state: bool) -> Path:
    rng = random.Random(0)
    run = tmp / name
    (run / "traces").mkdir(parents=True)
    for step in range(3):
        trees = [_tree(rng, decided_by_state) for _ in range(100)]
        (run / "traces" / f"step-{step:06d}.json").write_text(json.dumps({"step": step, "trees": trees}))
    rows = [{"step": s, "focus/continuations": 4, "focus/launch_share_depth0": 0.25,
             "focus/launch_share_depth2": 0.25, "focus/launch_share_depth5": 0.5} for s in (1, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_state_share_is_high_only_where_the_state_decides_the_outcome(tmp_path, capsys):
    decided = toi.run_info(_run(tmp_path, "decided", True))
    coin = toi.run_info(_run(tmp_path, "coin", False))
    # per tree: 3 pairs below one depth-4 state, 12 sharing only the root (paths of different
    # chains); none whose deepest shared state is at depth 1-3 or 7+
    assert decided["pairs"] == [3600, 0, 900, 0] and decided["trees"] == 300
    assert decided["state_share"][0] == 0.0 and decided["state_share"][1] is None
    assert decided["state_share"][2] > 0.8          # the depth-4 state decides the outcome
    assert abs(coin["state_share"][2]) < 0.2        # it says nothing: the leaves are coins
    assert decided["launch_share"] == [0.25, 0.25, 0.5, 0.0]   # depth 5 is in 4-6
    toi.main([str(tmp_path / "decided"), str(tmp_path / "coin"), "--json", str(tmp_path / "o.json")])
    out = capsys.readouterr().out
    assert "state share at shared depth 4-6" in out and "/decided | 300 |" in out
    assert json.loads((tmp_path / "o.json").read_text())[0]["pairs"][2] == 900
