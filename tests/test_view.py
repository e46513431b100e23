"""`agentrl view`: the traces a run keeps (what, how big), the report built from them (curves,
trees, episodes, the critic; sweeps), and the terminal view. The page in a real browser:
tests/test_view_browser.py."""
from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from agentrl_cli.cli.main import app
from agentrl_cli.reporting import view as view_mod
from agentrl_cli.reporting.trace_text import node_line, text_view, tree_text
from agentrl_cli.reporting.traces import TRACE_CAP, pick_steps, read_trace, trace_steps
from agentrl_cli.rollout.tree import Tree
from agentrl_cli.train import loop, traces
from agentrl_cli.train.run_folder import RUN_FILES
from agentrl_cli.app.train import train as checked_train

# a short FOCUS run of the shipped agent: small steps that still branch, every step traced
SHORT = ["rollout.tasks_per_step=2", "rollout.group_size=4", "train.eval_tasks=3",
         "train.eval_samples=1", "train.eval_every=2", "train.save_every=0", "train.trace_every=2"]


@pytest.fixture(scope="module")
def focus_run(tmp_path_factory):
    """(run folder, CLI output, {step: (episodes, advantages)}) of a 3-step FOCUS run made with
    `agentrl train`, traced at steps 1, 2 and 3 (step 1, every 2, the last)."""
    mp = pytest.MonkeyPatch()
    seen = {}
    real = loop.write_trace

    def keep(out, step, eps, batch, trees, fmt, method="", **kw):
        seen[step] = (eps, batch.advantages.clone(), batch.response_mask.clone())
        return real(out, step, eps, batch, trees, fmt, method, **kw)

    mp.setattr(loop, "write_trace", keep)
    out = tmp_path_factory.mktemp("view") / "run"
    args = ["train", "--method", "focus", "--steps", "3", "--out", str(out)]
    for s in SHORT:
        args += ["--set", s]
    r = CliRunner().invoke(app, args)
    mp.undo()
    assert r.exit_code == 0, r.output
    return out, r.output, seen


def test_train_traces_steps_and_prints_the_view_command(focus_run):
    out, output, seen = focus_run
    assert f"agentrl view {out}" in output
    assert sorted(trace_steps(out)) == sorted(seen) == [1, 2, 3]
    assert [s for s in range(1, 101) if traces.trace_due(s, 10, 100)] == [1, *range(10, 101, 10)]
    assert not any(traces.trace_due(s, 0, 100) for s in range(1, 101))
    assert "traces" in RUN_FILES and "report.html" in RUN_FILES


def test_traced_episodes_carry_every_token_its_mask_and_advantage(focus_run):
    out, _, seen = focus_run
    for step, path in trace_steps(out).items():
        data = read_trace(path)
        eps, adv, mask = seen[step]
        assert data["episodes_in_step"] == len(eps) and 0 < len(data["episodes"]) <= traces.MAX_EPISODES
        for e in data["episodes"]:
            row, src = e["row"], eps[e["row"]]
            n = len(src.token_ids)
            assert len(e["tokens"]) == len(e["response_mask"]) == len(e["advantages"]) == n
            assert e["response_mask"] == src.response_mask == [int(m) for m in mask[row, :n].tolist()]
            assert e["trained_tokens"] == sum(src.response_mask)
            for a, m, ref in zip(e["advantages"], e["response_mask"], adv[row, :n].tolist()):
                assert a == (pytest.approx(ref, abs=1e-4) if m else 0)
            asked = next(x.question for x in eps if x.group == src.group and x.question)
            assert e["question"] == asked and e["gold_answer"] == src.answer   # continuations too
            assert [t["action"] for t in e["turns"]] == [t.action for t in src.turns]


def test_traced_trees_carry_each_nodes_action_and_segment_advantage(focus_run):
    out, _, seen = focus_run
    branched = 0
    for step, path in trace_steps(out).items():
        data = read_trace(path)
        eps, adv, _ = seen[step]
        assert data["trees_in_step"] > 0 and len(data["trees"]) <= traces.MAX_TREES
        for t in data["trees"]:
            rows = {e.meta.focus_path: i for i, e in enumerate(eps)}
            for nd in t["nodes"]:
                if nd["parent"] < 0:
                    assert nd["action"] is None
                    continue
                turn = eps[rows[nd["path"]]].turns[nd["depth"] - 1]
                assert nd["action"] == turn.action
                seg = adv[rows[nd["path"]], turn.start:turn.end]
                assert nd["advantage"] == pytest.approx(float(seg.mean()), abs=1e-4)
            launched = sum(nd["launched"] for nd in t["nodes"])
            ranks = sorted(r for nd in t["nodes"] for r in nd["launch_order"])
            assert ranks == list(range(1, launched + 1))
            assert sum(b["paths"] for b in t["budget_by_depth"]) == len(t["paths"])
            branched += launched > 0
    assert branched, "the short run must branch somewhere to test the trees"


def _hand_tree() -> Tree:
    """Root paths 0 and 1 (depth 2 each), then continuations 2 (from node 1) and 3 (from the
    root), in that order."""
    t = Tree("t", 0)
    t.add(-1, 0, 10, 0)
    for pid in (0, 1):
        ids = t.start_path(pid, 0, continuation=False)
        t.grow(pid, ids, 1, 20)
        t.land(pid, ids, 0, False, float(pid), 2, 30)
    for pid, origin in ((2, 1), (3, 0)):
        ids = t.start_path(pid, origin, continuation=True)
        t.land(pid, ids, origin, True, 1.0, t.nodes[origin].depth + 1, 40)
    return t


def test_launch_order_and_budget_by_depth_on_a_hand_tree():
    from types import SimpleNamespace

    t = _hand_tree()
    assert traces.continuations(t) == {2: 1, 3: 0}
    assert traces._launch_order(t) == {1: [1], 0: [2]}
    eps = [SimpleNamespace(generated_tokens=g) for g in (5, 6, 7, 8)]
    got = traces.budget_by_depth([t], eps, {0: 0, 1: 1, 2: 2, 3: 3})
    assert got == [{"depth": None, "paths": 2, "tokens": 11}, {"depth": 0, "paths": 1, "tokens": 8},
                   {"depth": 1, "paths": 1, "tokens": 7}]


def test_a_trace_keeps_within_its_cap():
    data = {"step": 1, "trees": [{"x": "t" * 500}] * 3, "episodes": [{"x": "e" * 1000}] * 10}
    text = traces.fit(dict(data), 4000)
    got = json.loads(text)
    assert len(text) <= 4000 and got["left_out"]["episodes"] > 0
    assert len(got["episodes"]) + got["left_out"]["episodes"] == 10
    tiny = json.loads(traces.fit(dict(data), 100))
    assert tiny["episodes"] == [] and tiny["trees"] == [] and tiny["left_out"]["trees"] == 3


def test_report_size_is_bounded_and_a_100_step_run_stays_under_5_mb(focus_run, tmp_path):
    """Measured on the short run, then bounded for a default 100-step run: 11 traces at their
    cap, 101 metrics rows as long as the longest measured one, the page around them."""
    out, _, _ = focus_run
    path, size, _, _ = view_mod.write_report(out, tmp_path / "r.html")
    assert path.stat().st_size == size
    assert all(p.stat().st_size <= TRACE_CAP for p in trace_steps(out).values())
    data = view_mod.run_data(out)
    traced = sum(len(json.dumps(t, separators=(",", ":"))) for t in data["traces"])
    row = max(len(json.dumps(r)) for r in data["metrics"])
    page = size - traced - sum(len(json.dumps(r)) for r in data["metrics"])
    n_traces = sum(traces.trace_due(s, 10, 100) for s in range(1, 101))
    bound = page + min(n_traces, view_mod.MAX_TRACES) * TRACE_CAP + 101 * row
    assert n_traces == 11 and bound < 5_000_000, bound
    # any run: at most MAX_TRACES traces and MAX_ROWS rows
    assert view_mod.MAX_TRACES * TRACE_CAP + view_mod.MAX_ROWS * 2 * row + page < 5_000_000


def test_report_embeds_curves_trees_and_episodes_and_escapes_the_data(focus_run, tmp_path):
    out, _, _ = focus_run
    data = view_mod.run_data(out)
    assert data["kind"] == "run" and data["method"] == "focus" and data["traced_steps"] == [1, 2, 3]
    assert any("eval/success" in r and "eval/success_se" in r for r in data["metrics"])
    assert any("rollout/tool_calls" in r for r in data["metrics"])
    data["title"] = "a </script><b>title"
    data["traces"][0]["episodes"][0]["question"] = "</script><script>alert(1)</script>"
    html = view_mod.page(data)
    assert html.count("</script>") == 2 and "<b>title" not in html
    bare = html.replace('"http://www.w3.org/2000/svg"', "")      # the SVG namespace, not a fetch
    assert "http://" not in bare and "https://" not in bare and " src=" not in bare
    assert json.loads(html.split('id="data">')[1].split("</script>")[0])["traces"][0]["episodes"][0][
        "question"].startswith("</script>")


def test_a_run_without_traces_still_gets_its_curves(focus_run, tmp_path):
    out, _, _ = focus_run
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "metrics.jsonl", "summary.json"):
        shutil.copy(out / name, bare / name)
    r = CliRunner().invoke(app, ["view", str(bare)])
    assert r.exit_code == 0, r.output
    html = (bare / "report.html").read_text()
    data = json.loads(html.split('id="data">')[1].split("</script>")[0])
    assert data["traces"] == [] and data["metrics"]
    r = CliRunner().invoke(app, ["view", str(bare), "--text"])
    assert r.exit_code == 2 and "no traces" in r.output


def test_view_command_text_and_errors(focus_run, tmp_path):
    out, _, _ = focus_run
    r = CliRunner().invoke(app, ["view", str(out), "--out", str(tmp_path / "x" / "report.html")])
    assert r.exit_code == 0 and (tmp_path / "x" / "report.html").is_file(), r.output
    r = CliRunner().invoke(app, ["view", str(out), "--text"])
    assert r.exit_code == 0 and "--tree 0" in r.output and "--episode 0" in r.output, r.output
    r = CliRunner().invoke(app, ["view", str(out), "--text", "--step", "1", "--episode", "0"])
    assert r.exit_code == 0 and "turn 0" in r.output and "gold answer" in r.output, r.output
    for bad, says in ((["--tree", "0"], "add --text"), (["--text", "--tree", "0", "--episode", "0"], "not both"),
                      (["--text", "--step", "7"], "traced steps: 1, 2, 3"),
                      (["--text", "--tree", "99"], "no tree 99")):
        r = CliRunner().invoke(app, ["view", str(out), *bad])
        assert r.exit_code == 2 and says in r.output, (bad, r.output)
    r = CliRunner().invoke(app, ["view", str(tmp_path)])
    assert r.exit_code == 2 and "neither a run folder" in r.output


def test_tree_text_shows_every_node_once_and_folds_identical_siblings(focus_run):
    out, _, _ = focus_run
    data = read_trace(trace_steps(out)[1])
    t = max(data["trees"], key=lambda t: len(t["nodes"]))
    text = tree_text(t, 1, 0)
    for nd in t["nodes"]:                  # every node is named, alone or in a folded group
        assert f"[{nd['id']}]" in text or f", {nd['id']}]" in text or f"[{nd['id']}," in text
    leaf = {"parent": 0, "depth": 1, "action": "answer(x)", "observation": "", "reward": 1.0,
            "n": 1, "children": [], "launched": 0, "advantage": 0.5}
    hand = {"task_id": "t", "nodes": [{"id": 0, "parent": -1, "depth": 0, "v": 0.5, "V_tilde": 0.6,
                                       "G_bar": 0.7, "n": 3, "cbar": 1.0, "reward": None,
                                       "launched": 2, "launch_order": [1, 2], "children": [1, 2, 3]},
                                      *[{**leaf, "id": i} for i in (1, 2, 3)]], "paths": {}}
    text = tree_text(hand, 5, 0)
    assert "×3 [1, 2, 3] answer(x)" in text and "launched 2 (#1, #2)" in text
    assert "v 0.50  Ṽ 0.60  Ḡ 0.70  n 3" in node_line(hand["nodes"][0])
    assert "\x1b" not in node_line({**leaf, "action": "a\x1b[2Jb"})


def test_sweep_report_has_curves_and_final_vs_parameter_per_cell_and_seed(focus_run, tmp_path):
    out, _, _ = focus_run
    sweep = tmp_path / "sweep"
    cells = []
    for name, beta in (("focus-beta=0", "0"), ("focus-beta=1", "1")):
        for seed in (0, 1):
            d = sweep / "cells" / name / f"seed-{seed}"
            d.mkdir(parents=True)
            for f in ("config.json", "metrics.jsonl", "summary.json"):
                shutil.copy(out / f, d / f)
        cells.append({"name": name, "method": "focus", "params": {"algo.beta": beta}, "sets": []})
    (sweep / "ablation.json").write_text(json.dumps({"budget_tokens": 100, "seeds": [0, 1], "cells": cells}))
    data = view_mod.sweep_data(sweep)
    assert data["kind"] == "sweep" and data["axes"] == ["algo.beta"]
    assert [len(c["runs"]) for c in data["cells"]] == [2, 2]
    assert all(r["metrics"] and set(r["metrics"][0]) <= {"step", *view_mod.SWEEP_KEYS}
               for c in data["cells"] for r in c["runs"])
    r = CliRunner().invoke(app, ["view", str(sweep)])
    assert r.exit_code == 0 and (sweep / "report.html").is_file(), r.output


def test_pick_steps_spreads_and_keeps_the_ends():
    assert pick_steps([1, 2, 3], 12) == [1, 2, 3]
    got = pick_steps(list(range(1, 1001)), 12)
    assert len(got) == 12 and got[0] == 1 and got[-1] == 1000


def test_text_view_defaults_to_the_last_traced_step(focus_run):
    out, _, _ = focus_run
    assert text_view(out).startswith("step 3 (focus)")


def test_a_method_without_trees_traces_episodes_and_its_critics_turn_values(tmp_path):
    """PPO: no trees; the critic's value before each turn against the episode's reward."""
    from agentrl_cli import config

    from conftest import MICRO

    cfg = config.load(sets=MICRO + ["train.steps=1", "train.eval_every=0", "train.save_every=0",
                                    "train.trace_every=1"], method="ppo")
    seen = {}
    real = loop.write_trace

    def keep(out, step, eps, batch, trees, fmt, method="", **kw):
        seen["eps"], seen["values"] = eps, batch.old_values.clone()
        return real(out, step, eps, batch, trees, fmt, method, **kw)

    mp = pytest.MonkeyPatch()
    mp.setattr(loop, "write_trace", keep)
    try:
        checked_train(cfg, tmp_path / "run", log=lambda s: None)
    finally:
        mp.undo()
    data = read_trace(trace_steps(tmp_path / "run")[1])
    eps = seen["eps"]
    assert data["trees"] == [] and data["trees_in_step"] == 0 and len(data["episodes"]) == len(eps)
    c = data["critic"]
    assert c["source"] == "turn values" and len(c["v"]) == sum(e.num_turns for e in eps)
    assert c["v"][0] == pytest.approx(float(seen["values"][0, eps[0].turns[0].start]), abs=1e-4)
    assert c["outcome"][0] == eps[0].reward
