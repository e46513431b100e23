"""A user's FOCUS allocator (`algo.focus_allocator=FILE.py:NAME`): loaded like a user env,
called with the candidates and an `AllocatorContext`, recorded absolute with the run, and a
missing attribute is one line before any model loads."""
import json
import os
import random

from typer.testing import CliRunner

from agentrl_cli.cli.main import app
from agentrl_cli.rollout import planner
from agentrl_cli.rollout.tree import Tree

from compare_metrics import differences, rows
from conftest import set_args

runner = CliRunner()

DEEPEST = '''
import json
from pathlib import Path

LOG = Path(__file__).with_name("calls.jsonl")


def deepest(candidates, ctx):
    """Always the deepest candidate (ties: the first)."""
    pick = max(candidates, key=lambda nd: nd.depth)
    with LOG.open("a") as f:
        f.write(json.dumps({"depths": [nd.depth for nd in candidates], "pick": pick.depth,
                            "allocator": ctx.algo.focus_allocator, "trees": len(ctx.trees),
                            "rng": ctx.rng is not None}) + "\\n")
    return pick
'''


VANDAL = DEEPEST + '''

def vandal(candidates, ctx):
    """The deepest one's pick, then every input changed: the evidence, values, children and
    env snapshot of every node, the trees' paths, the trees list and the candidates list."""
    pick = deepest(candidates, ctx)
    for tree in ctx.trees:
        for nd in tree.nodes:
            nd.n, nd.csum, nd.v, nd.g, nd.launched, nd.inflight = 0, 9.0, 0.0, 5.0, 99, 7
            nd.children.clear()
            if isinstance(nd.snapshot, dict):
                nd.snapshot["history"].clear()
                nd.snapshot["steps"] = 99
        tree.paths.clear()
        tree.through.clear()
    ctx.trees.clear()
    candidates.clear()
    return pick
'''


def _one_line_error(res, *parts):
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    for p in parts:
        assert p in lines[0], lines[0]


def test_a_user_allocator_drives_a_focus_run(tmp_path, monkeypatch):
    (tmp_path / "alloc").mkdir()
    (tmp_path / "alloc" / "deepest.py").write_text(DEEPEST)
    monkeypatch.chdir(tmp_path)                     # given relative: recorded absolute
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--method", "focus", "--steps", "1", "--out", str(out),
                              "--set", "algo.focus_allocator=alloc/deepest.py:deepest",
                              *set_args(["rollout.group_size=4"])])
    assert res.exit_code == 0, res.output
    calls = [json.loads(x) for x in (tmp_path / "alloc" / "calls.jsonl").read_text().splitlines()]
    assert calls, "the allocator was never called"
    path = os.path.abspath("alloc/deepest.py")
    for c in calls:
        assert c["pick"] == max(c["depths"]) and c["trees"] == 2 and c["rng"]
        assert c["allocator"] == f"{path}:deepest"
    saved = json.loads((out / "config.json").read_text())["algo"]
    assert saved["focus_allocator"] == f"{path}:deepest"


def test_a_missing_allocator_is_one_line(tmp_path):
    f = tmp_path / "deepest.py"
    f.write_text(DEEPEST)
    res = runner.invoke(app, ["train", "--method", "focus", "--steps", "1",
                              "--out", str(tmp_path / "run"),
                              "--set", f"algo.focus_allocator={f}:deepst", *set_args()])
    _one_line_error(res, "focus allocator", "has no attribute 'deepst'", "did you mean 'deepest'?")
    assert not (tmp_path / "run" / "config.json").exists()
    res = runner.invoke(app, ["train", "--method", "focus", "--set", "algo.focus_allocator=focuss",
                              *set_args()])
    _one_line_error(res, "unknown focus allocator 'focuss'", "did you mean 'focus'?",
                    "FILE.py:NAME")


def test_builtin_allocators_take_the_context():
    t = Tree("task", 0)
    t.add(-1, 0, 10, 0, v=0.4, n=1, csum=1.0)
    t.add(0, 1, 20, 0, v=0.6, n=1, csum=0.0)
    for nd in t.nodes:
        nd.resumable = True
    ctx = planner.AllocatorContext(None, random.Random(0), [t])
    assert planner.ALLOCATORS.get("random")(t.nodes, ctx) is t.nodes[random.Random(0).randrange(2)]
    assert planner.ALLOCATORS.get("uniform")(t.nodes, ctx) is t.nodes[0]
    assert set(planner.ALLOCATORS.names()) >= {"focus", "uniform", "random", "raw-residual"}


def test_an_allocator_that_changes_its_inputs_changes_nothing(tmp_path):
    """It is handed copies: a run with an allocator that vandalises every node, tree and list it
    is handed after choosing has the same metrics as the run with the same choice untouched."""
    f = tmp_path / "alloc.py"
    f.write_text(VANDAL)
    runs = {}
    for name in ("deepest", "vandal"):
        out = tmp_path / name
        res = runner.invoke(app, ["train", "--method", "focus", "--steps", "2", "--out", str(out),
                                  "--set", f"algo.focus_allocator={f}:{name}",
                                  *set_args(["rollout.group_size=4"])])
        assert res.exit_code == 0, res.output
        runs[name] = rows(out / "metrics.jsonl")
    picks = [json.loads(x)["pick"] for x in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert len(picks) >= 4 and max(picks) > 0, picks       # both called, past the roots
    assert runs["deepest"] and not differences(runs["deepest"], runs["vandal"]), \
        differences(runs["deepest"], runs["vandal"])


AUDIT = '''
import sys


def deepest(candidates, ctx):
    return max(candidates, key=lambda nd: (nd.depth, -nd.id))


def vandal(candidates, ctx):
    pick = deepest(candidates, ctx)
    for tree in ctx.trees:
        for nd in tree.nodes:
            nd.n, nd.csum, nd.v, nd.launched, nd.own_inflight = 0, 9.0, 0.0, 99, 0
            nd.children.clear()
        tree.paths.clear()
    ctx.trees.clear()
    candidates.clear()
    return pick


def leave(candidates, ctx):
    sys.exit(0)
'''


def test_audit_tree_runs_a_user_allocator_on_copies_under_the_guard(tmp_path):
    """`diagnose audit-tree` calls a user's allocator as a run does: a vandalising one scores
    as the plain one, an exiting one is one line naming it."""
    f = tmp_path / "audit_alloc.py"
    f.write_text(AUDIT)
    js = tmp_path / "audit.json"
    res = runner.invoke(app, ["diagnose", "audit-tree", "--budget", "8", "--seeds", "2",
                              "--allocators", f"{f}:deepest,{f}:vandal", "--json", str(js),
                              "--png", str(tmp_path / "audit.png")])
    assert res.exit_code == 0, res.output
    for per in json.loads(js.read_text()).values():
        plain, vandal = per[f"{f}:deepest"], per[f"{f}:vandal"]
        assert plain["mse"] == vandal["mse"] and len(plain["mse"]) == 5, (plain, vandal)
    res = runner.invoke(app, ["diagnose", "audit-tree", "--budget", "4", "--seeds", "1",
                              "--allocators", f"{f}:leave", "--png", str(tmp_path / "b.png")])
    _one_line_error(res, f"focus allocator '{f}:leave'", "audit_alloc.py:",
                    "raised SystemExit: 0: user code must not end the process")
