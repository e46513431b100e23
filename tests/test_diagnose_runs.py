"""`agentrl diagnose table | tool-call-table | tree-info | allocation-map | episode-stats`: the
analyses of past runs (agentrl_cli/diagnostics/analysis), read through reporting.run_reader and
driven as a user does, through the command."""
from __future__ import annotations

import json
import random
from pathlib import Path

from typer.testing import CliRunner

from agentrl_cli.cli.main import app
from agentrl_cli.diagnostics.analysis import verdict_table as vt
from agentrl_cli.reporting import records
from conftest import complete_tree, set_args

runner = CliRunner()


def _run(root: Path, method: str, seed: int, checks: list[float], tokens=100, s=2.0,
         zero: list[float] | None = None, extra: list[dict] | None = None) -> Path:
    """A finished run folder of an ablate sweep: a check per step (step 0 the base), `extra`
    merged into the training steps' rows."""
    run = root / "cells" / method / f"seed-{seed}"
    run.mkdir(parents=True)
    rows = [{"step": 0, "eval/success": checks[0], "eval/success_se": 0.03,
             "eval/tokens_per_question": 40.0}]
    for i, c in enumerate(checks[1:], 1):
        rows.append({"step": i, "rollout/tokens": tokens, "time/step": s, "eval/success": c,
                     "eval/success_se": 0.05, "eval/tokens_per_question": 41.0})
        if zero is not None:
            rows[-1]["rollout/zero_spread_groups"] = zero[i - 1]
        if extra is not None and i - 1 < len(extra):
            rows[-1].update(extra[i - 1])
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"method": method, "seed": seed}))
    return run


def _traces(run: Path, counts: list[tuple[int, int]], group: int = 4) -> None:
    """A config (rollout.group_size) and one trace per step: (episodes_in_step, trees_in_step)."""
    (run / "config.json").write_text(json.dumps({"rollout": {"group_size": group}}))
    (run / "traces").mkdir()
    for step, (eps, trees) in enumerate(counts, 1):
        (run / "traces" / f"step-{step:06d}.json").write_text(json.dumps(
            {"step": step, "trees": [], "episodes": [], "episodes_in_step": eps,
             "trees_in_step": trees}))


def _table(*args) -> list[str]:
    res = runner.invoke(app, ["diagnose", "table", *map(str, args)])
    assert res.exit_code == 0, res.output
    return res.output.splitlines()


def _golden(root: Path) -> Path:
    """An ablate folder with every column's input: GRPO and FOCUS on three seeds (mixed-outcome
    shares, traces, FOCUS's launch depths and critic rank, pass@4 files), `b` on two seeds with
    none of them."""
    for seed in range(3):
        g = _run(root, "grpo", seed, [0.3, 0.4 + 0.03 * seed, 0.5 + 0.05 * seed], tokens=2000 + seed,
                 zero=[0.5, 0.4 - 0.1 * seed])
        _traces(g, [(80, 0), (72 + 4 * seed, 0)])
        f = _run(root, "focus", seed, [0.3, 0.45 + 0.02 * seed, 0.52 + 0.01 * seed], tokens=2010,
                 s=3.5, zero=[0.3, 0.25], extra=[
                     {"focus/launch_share_depth0": 0.2, "focus/launch_share_depth1": 0.3,
                      "focus/launch_share_depth3": 0.5, "focus/critic_rank": 0.1 * seed},
                     {"focus/launch_share_depth0": 0.4, "focus/launch_share_depth2": 0.6}])
        _traces(f, [(30, 4), (31, 4)])
        for run, p4 in ((g, 0.6 + 0.05 * seed), (f, 0.55 + 0.1 * seed)):
            (run / vt.PASS_FILE).write_text(json.dumps({"pass@k": {"1": 0.4, "4": p4}}))
        for run, wall in ((g, 100.0 + seed), (f, 150.0 + seed)):
            summary = json.loads((run / "summary.json").read_text())
            summary.update({"wall_seconds": wall, "env": "search", "budget_tokens": 2000, "steps": 2})
            (run / "summary.json").write_text(json.dumps(summary))
    for seed in range(2):
        _run(root, "b", seed, [0.3, 0.35, 0.45 - 0.1 * seed], tokens=1500, s=1.25)
    return root


# `python benchmarks/methods_table.py SWEEP` (and `--reference focus`) printed these on
# `_golden`'s runs before the table moved into the package (2026-12-07, build ef96c6c)
GOLDEN = (
    '| method | seeds | mean of checks | final - base (points) | vs grpo (points, paired) | verdict | last check vs grpo | gen. tokens / step | pass@k at the end | tasks / step | mixed-outcome groups | continuations by depth | critic rank (rho) | tokens / eval question | s / step | se of one check |\n'
    '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n'
    '| `focus` | 0,1,2 | 0.500 ± 0.015 | +23.0 ± 1.0 | +1.0 ± 1.4 | level | -2.0 ± 2.3 | 2010 ± 0 | @4 0.650 ± 0.100 | 4.0 ± 0.0 | 0.72 ± 0.00 | d0 0.30 d1 0.15 d2+ 0.55 | 0.10 ± 0.10 | 41.0 ± 0.0 | 3.50 ± 0.00 | 0.043 |\n'
    '| `grpo` | 0,1,2 | 0.490 ± 0.040 | +25.0 ± 5.0 | reference | – | – | 2001 ± 1 | @4 0.650 ± 0.050 | 19.5 ± 0.5 | 0.60 ± 0.05 | – | – | 41.0 ± 0.0 | 2.00 ± 0.00 | 0.043 |\n'
    '| `b` | 0,1 | 0.375 ± 0.035 | +10.0 ± 7.1 | -9.5 ± 4.5 | behind | -12.5 ± 7.5 | 1500 ± 0 | – | – | – | – | – | 41.0 ± 0.0 | 1.25 ± 0.00 | 0.043 |\n'
)
GOLDEN_FOCUS = (
    '| method | seeds | mean of checks | final - base (points) | vs focus (points, paired) | verdict | last check vs focus | gen. tokens / step | pass@k at the end | tasks / step | mixed-outcome groups | continuations by depth | critic rank (rho) | tokens / eval question | s / step | se of one check |\n'
    '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n'
    '| `focus` | 0,1,2 | 0.500 ± 0.015 | +23.0 ± 1.0 | reference | – | – | 2010 ± 0 | @4 0.650 ± 0.100 | 4.0 ± 0.0 | 0.72 ± 0.00 | d0 0.30 d1 0.15 d2+ 0.55 | 0.10 ± 0.10 | 41.0 ± 0.0 | 3.50 ± 0.00 | 0.043 |\n'
    '| `grpo` | 0,1,2 | 0.490 ± 0.040 | +25.0 ± 5.0 | -1.0 ± 1.4 | level | +2.0 ± 2.3 | 2001 ± 1 | @4 0.650 ± 0.050 | 19.5 ± 0.5 | 0.60 ± 0.05 | – | – | 41.0 ± 0.0 | 2.00 ± 0.00 | 0.043 |\n'
    '| `b` | 0,1 | 0.375 ± 0.035 | +10.0 ± 7.1 | -11.8 ± 3.3 | behind | -12.5 ± 5.5 | 1500 ± 0 | – | – | – | – | – | 41.0 ± 0.0 | 1.25 ± 0.00 | 0.043 |\n'
)
# the arms of `--record` from the same script on `_golden`'s runs (before it gained the per-seed
# tasks / step and mixed-outcome share)
GOLDEN_ARMS = json.loads(
    '[{"name":"grpo","label":"`grpo`","seeds":[0,1,2],"per_seed":{"base":[0.3,0.3,0.3],"final":'
    '[0.5,0.55,0.6],"mean_of_checks":[0.45,0.49000000000000005,0.53],"tokens_per_step":[2000,20'
    '01,2002],"pass_at_k":[0.6,0.65,0.7],"wall_s":[100.0,101.0,102.0]},"pass_k":4},{"name":"b",'
    '"label":"`b`","seeds":[0,1],"per_seed":{"base":[0.3,0.3],"final":[0.45,0.35],"mean_of_chec'
    'ks":[0.4,0.35],"tokens_per_step":[1500,1500]},"reference":"grpo"},{"name":"focus","label":'
    '"`focus`","seeds":[0,1,2],"per_seed":{"base":[0.3,0.3,0.3],"final":[0.52,0.53,0.54],"mean_'
    'of_checks":[0.485,0.5,0.515],"tokens_per_step":[2010,2010,2010],"pass_at_k":[0.55,0.65,0.7'
    '5],"wall_s":[150.0,151.0,152.0]},"pass_k":4,"reference":"grpo"}]'
)


def test_the_table_prints_what_the_script_printed_byte_for_byte(tmp_path):
    sweep = _golden(tmp_path / "sweep")
    res = runner.invoke(app, ["diagnose", "table", str(sweep)])
    assert res.exit_code == 0 and res.output == GOLDEN
    res = runner.invoke(app, ["diagnose", "table", "--reference", "focus", str(sweep)])
    assert res.exit_code == 0 and res.output == GOLDEN_FOCUS


def test_the_record_carries_tasks_per_step_and_the_mixed_share_per_seed(tmp_path):
    sweep = _golden(tmp_path / "sweep")
    out = tmp_path / "rec.json"
    res = runner.invoke(app, ["diagnose", "table", "--record", str(out), "--title", "T",
                              "--command", "agentrl ablate --out sweep", str(sweep)])
    assert res.exit_code == 0 and res.output == GOLDEN + f"record: {out}\n"
    rec = json.loads(out.read_text())
    assert rec["commands"] == ["agentrl ablate --out sweep",
                               f"agentrl diagnose table --reference grpo {sweep}"]
    assert rec["source"] == "made from run folders by agentrl diagnose table --record"
    # `b`'s runs name no env or budget: the record names one only when every run agrees
    assert (rec["title"], rec["env"], rec["budget"], rec["steps"]) == ("T", None, None, 2)
    arms = {a["name"]: a for a in rec["arms"]}
    assert arms["grpo"]["per_seed"]["tasks_per_step"] == [19.0, 19.5, 20.0]     # (80 + 72 + 4s) / 2 / 4
    assert arms["focus"]["per_seed"]["tasks_per_step"] == [4, 4, 4]             # its trees
    assert arms["grpo"]["per_seed"]["mixed_outcome_share"] == [0.55, 0.6, 0.65]
    assert arms["focus"]["per_seed"]["mixed_outcome_share"] == [0.725] * 3
    assert "tasks_per_step" not in arms["b"]["per_seed"]      # no traces: not a number per seed
    for arm in rec["arms"]:
        arm["per_seed"].pop("tasks_per_step", None)
        arm["per_seed"].pop("mixed_outcome_share", None)
    assert rec["arms"] == GOLDEN_ARMS
    # the record's table shows them as columns; an arm without them gets –
    text = records.record_table(rec | {"arms": json.loads(out.read_text())["arms"]})
    assert "| gen. tokens / step | tasks / step | mixed-outcome groups |" in text
    assert "| `grpo` | 0-2 | 0.490 ± 0.040 |" in text and "| 19.5 ± 0.5 | 0.60 ± 0.05 |" in text
    assert next(x for x in text.splitlines() if x.startswith("| `b`")).endswith("| 1500 ± 0 | – | – |")
    assert not records.check_record(json.loads(out.read_text()))


def test_an_old_record_keeps_its_columns():
    """A record without the new per-seed values shows the columns it always did."""
    rec = {"title": "t", "date": "d", "build": "b", "env": "search", "steps": 2, "commands": [],
           "source": "s", "arms": GOLDEN_ARMS}
    head = next(x for x in records.record_table(rec).splitlines() if x.startswith("| method"))
    assert head.endswith("| gen. tokens / step |")


def test_the_users_mistakes_are_one_line(tmp_path):
    sweep = _golden(tmp_path / "sweep")
    for args, says in [([str(tmp_path / "none")], "no finished runs"),
                       (["--checks", "1-2", "--record", str(tmp_path / "r.json"), str(sweep)], "exploration"),
                       (["--checks", "x", str(sweep)], "give LO-HI")]:
        res = runner.invoke(app, ["diagnose", "table", *args])
        assert res.exit_code == 2 and says in res.output and "Traceback" not in res.output, args
    assert not (tmp_path / "r.json").exists()


def test_paired_differences_and_the_verdict_rule(tmp_path):
    # grpo's mean of checks (steps 1, 2) per seed: 0.5, 0.6, 0.7
    for seed, c in enumerate([[0.3, 0.4, 0.6], [0.3, 0.5, 0.7], [0.3, 0.6, 0.8]]):
        _run(tmp_path, "grpo", seed, c)
    # a: +0.10, +0.12, +0.08 -> mean +0.10, se 0.0115: ahead
    for seed, c in enumerate([[0.3, 0.5, 0.7], [0.3, 0.62, 0.82], [0.3, 0.66, 0.90]]):
        _run(tmp_path, "a", seed, c)
    # b: +0.10, -0.10, 0.00 -> mean 0, se 0.0577: level
    for seed, c in enumerate([[0.3, 0.5, 0.7], [0.3, 0.4, 0.6], [0.3, 0.6, 0.8]]):
        _run(tmp_path, "b", seed, c)
    # c: -0.05 on every seed but one -> behind
    for seed, c in enumerate([[0.3, 0.35, 0.55], [0.3, 0.45, 0.65], [0.3, 0.55, 0.75]]):
        _run(tmp_path, "c", seed, c, s=3.0)
    lines = _table(tmp_path)
    rows = {x.split(" | ")[0][2:]: x.split(" | ") for x in lines[2:]}
    assert rows["`a`"][4:7] == ["+10.0 ± 1.2", "ahead", "+10.7 ± 0.7"]    # last check: +.10 +.12 +.10
    assert rows["`a`"][3] == "+50.7 ± 10.1" and rows["`a`"][15] == "0.043 |"   # every check's se, the base's too
    assert rows["`b`"][5] == "level" and rows["`c`"][5] == "behind"
    assert rows["`c`"][14] == "3.00 ± 0.00"
    assert rows["`c`"][10:13] == ["–", "–", "–"]     # no mixed share, no continuations, no critic rank
    assert rows["`grpo`"][4] == "reference"
    # seeds the reference lacks are not paired; one shared seed gives no verdict
    by = {}
    for r in vt.load_runs([tmp_path]):
        by.setdefault(r["label"], []).append(r)
    assert vt.paired(by["a"][:1], by["grpo"]) is None and vt.verdict(None) == "–"


def test_a_window_of_checks(tmp_path):
    _run(tmp_path, "grpo", 0, [0.3, 0.4, 0.6, 0.8])
    col = lambda args: _table(*args, tmp_path)[2].split(" | ")[2]    # noqa: E731
    assert col([]) == "0.600"
    assert col(["--checks", "2-3"]) == "0.700"
    assert col(["--checks", "0-1"]) == "0.400"        # step 0 is the base, never a check


def test_the_mixed_outcome_share_is_the_mean_over_steps_of_groups_with_a_signal(tmp_path):
    _run(tmp_path, "grpo", 0, [0.3, 0.4, 0.5], zero=[0.25, 0.75])
    _run(tmp_path, "grpo", 1, [0.3, 0.4, 0.5], zero=[0.0, 0.5])
    assert _table(tmp_path)[2].split(" | ")[10] == "0.62 ± 0.18"     # 0.5 and 0.75


def test_continuations_by_depth_average_over_steps_and_seeds(tmp_path):
    for seed, rows in enumerate([[{0: 0.5, 1: 0.5}, {0: 1.0}], [{0: 0.25, 2: 0.5, 3: 0.25}]]):
        _run(tmp_path, "focus", seed, [0.1] * (len(rows) + 1),
             extra=[{f"focus/launch_share_depth{d}": v for d, v in r.items()} for r in rows])
    # seed 0: d0 .75 d1 .25; seed 1: d0 .25 d1 0 d2+ .75
    assert _table(tmp_path)[2].split(" | ")[11] == "d0 0.50 d1 0.12 d2+ 0.38"


def test_tasks_per_step_counts_trees_or_groups_over_the_traced_steps(tmp_path):
    """What a step learnt from: a tree method's trees, else its episodes / group size (GRPO
    draws fresh tasks to spend its budget), averaged over the traced steps."""
    run = _run(tmp_path, "grpo", 0, [0.3, 0.4])
    assert _table(tmp_path)[2].split(" | ")[9] == "–"            # no config, no traces
    _traces(run, [(80, 0), (72, 0), (194, 4)])
    assert _table(tmp_path)[2].split(" | ")[9] == "14.0"          # (20 + 18 + 4) / 3


def test_pass_at_k_of_the_last_checkpoint_in_the_table(tmp_path):
    """`--pass-k` keeps `agentrl eval`'s JSON in the run folder; the table reads the largest k."""
    for seed, p4 in enumerate([0.6, 0.7]):
        run = _run(tmp_path, "grpo", seed, [0.3, 0.4])
        (run / vt.PASS_FILE).write_text(json.dumps({"pass@k": {"1": 0.4, "2": 0.5, "4": p4}}))
    assert _table(tmp_path)[2].split(" | ")[8] == "@4 0.650 ± 0.071"


def test_the_critic_rank_is_the_mean_over_the_steps_that_logged_it(tmp_path):
    _run(tmp_path, "focus", 0, [0.1, 0.2, 0.3], extra=[{"focus/critic_rank": 0.2}])
    _run(tmp_path, "focus", 1, [0.1, 0.2, 0.3], extra=[{"focus/critic_rank": 0.5},
                                                       {"focus/critic_rank": 0.1}])
    _run(tmp_path, "grpo", 0, [0.1, 0.2, 0.3])
    lines = _table(tmp_path)
    col = lines[0].split(" | ").index("critic rank (rho)")
    assert next(x for x in lines if x.startswith("| `focus`")).split(" | ")[col] == "0.25 ± 0.07"
    assert next(x for x in lines if x.startswith("| `grpo`")).split(" | ")[col] == "–"


def test_the_tool_call_table_spans_seeds_and_flags_a_collapse(tmp_path):
    def run(method, seed, calls, success):
        folder = tmp_path / "cells" / method / f"seed-{seed}"
        folder.mkdir(parents=True)
        rows = [{"step": 0, "eval/success": 0.3, "eval/tool_calls": 8.0}]
        rows += [{"step": i + 1, "rollout/tool_calls": c, "success": s, "reward/mean": s / 2,
                  "rollout/context_resets": 0.5} for i, (c, s) in enumerate(zip(calls, success))]
        rows.append({"step": len(calls), "eval/success": 0.5, "eval/tool_calls": calls[-1]})
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / "summary.json").write_text(json.dumps({"method": method, "seed": seed}))

    run("grpo", 0, [8.0] * 10 + [1.0] * 10, [0.6] * 10 + [0.2] * 10)    # collapses
    run("grpo", 1, [8.0] * 20, [0.6] * 20)
    run("focus", 0, [6.0] * 10 + [7.0] * 10, [0.5] * 20)
    res = runner.invoke(app, ["diagnose", "tool-call-table", "--windows", "2", str(tmp_path)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert "calls, steps 1-10 | calls, steps 11-20" in lines[0]
    focus = next(x for x in lines if x.startswith("| `focus`"))
    grpo = next(x for x in lines if x.startswith("| `grpo`"))
    assert focus == "| `focus` | 0 | 6.00 | 7.00 | 0.25 | 0.50 | 8.00 / 7.00 | 0.30 / 0.50 | 0.50 | none |"
    assert grpo.startswith("| `grpo` | 0,1 | 8.00 | 4.50 |") and grpo.endswith("| 0 |")


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


def _tree_run(tmp: Path, name: str, decided_by_state: bool) -> Path:
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


def test_tree_info_state_share_is_high_only_where_the_state_decides_the_outcome(tmp_path):
    runs = [_tree_run(tmp_path, "decided", True), _tree_run(tmp_path, "coin", False)]
    res = runner.invoke(app, ["diagnose", "tree-info", *map(str, runs), "--json", str(tmp_path / "o.json")])
    assert res.exit_code == 0, res.output
    decided, coin = json.loads((tmp_path / "o.json").read_text())
    # per tree: 3 pairs below one depth-4 state, 12 sharing only the root (paths of different
    # chains); none whose deepest shared state is at depth 1-3 or 7+
    assert decided["pairs"] == [3600, 0, 900, 0] and decided["trees"] == 300
    assert decided["state_share"][0] == 0.0 and decided["state_share"][1] is None
    assert decided["state_share"][2] > 0.8          # the depth-4 state decides the outcome
    assert abs(coin["state_share"][2]) < 0.2        # it says nothing: the leaves are coins
    assert decided["launch_share"] == [0.25, 0.25, 0.5, 0.0]   # depth 5 is in 4-6
    assert "state share at shared depth 4-6" in res.output and "/decided | 300 |" in res.output
    res = runner.invoke(app, ["diagnose", "tree-info", str(tmp_path / "none")])
    assert res.exit_code == 2 and "no saved trees" in res.output


def test_the_allocation_map_draws_its_figure(tmp_path):
    for seed in range(3):
        _run(tmp_path, "grpo", seed, [0.2, 0.3, 0.4], zero=[0.5, 0.5])
        _run(tmp_path, "focus", seed, [0.2, 0.35 + 0.01 * seed, 0.45], zero=[0.3, 0.3])
    from agentrl_cli.diagnostics.analysis import allocation_map as am
    (gain, se, n), = am.gains(vt.load_runs([tmp_path]), "grpo").values()
    # focus - grpo per seed: +0.05, +0.055, +0.06 (mean of checks over steps 1, 2)
    assert n == 3 and abs(gain - 5.5) < 1e-9 and abs(se - 0.5 / 3 ** 0.5) < 1e-9
    out = tmp_path / "map.png"
    res = runner.invoke(app, ["diagnose", "allocation-map", str(tmp_path), "--out", str(out)])
    assert res.exit_code == 0 and f"figure: {out}" in res.output
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_episode_stats_of_the_base_model_and_the_expert(tmp_path):
    out = tmp_path / "stats.json"
    res = runner.invoke(app, ["diagnose", "episode-stats", "--benchmark", "search-long",
                              *set_args(), "--json", str(out)])
    assert res.exit_code == 0, res.output
    stats = json.loads(out.read_text())
    assert stats["benchmark"] == "search-long" and stats["eval"].startswith("3 tasks x 1 samples")
    assert stats["model_row"]["episodes"] == 3
    # the expert once per task, the demonstrator 20 times, within the micro settings' 3 turns
    assert stats["env"]["max_turns"] == 3 and stats["expert"]["episodes"] == 3
    assert stats["expert"]["turns_per_episode"] <= 3
    demo = next(k for k in stats if k.startswith("demonstrator_e"))
    assert stats[demo]["episodes"] == 60 and set(stats["seconds"]) == {"load", "eval"}


def test_the_record_of_a_tuned_sweep_carries_its_tuning_stage(tmp_path):
    """`agentrl ablate --tune` writes tuning.json beside cells/: the record keeps it (the picks
    and the tuning runs' numbers), and the verdict table of the results page shows the picks."""
    sweep = tmp_path / "sweep"
    for seed in range(3):
        _run(sweep, "grpo", seed, [0.3, 0.4 + 0.01 * seed])
        _run(sweep, "focus", seed, [0.3, 0.45 + 0.01 * seed])
    point = lambda lr, score: {"cell": f"x_lr={lr}", "values": {"train.lr": lr},  # noqa: E731
                               "sets": [f"train.lr={lr}"], "mean_of_checks": {"100": score},
                               "score": score}
    tuning = {"rule": "mean of checks", "seeds": [100], "runs_per_method": 2, "budget_tokens": 100,
              "methods": {m: {"keys": ["train.lr"], "points": [point("2e-4", 0.4), point(lr, 0.5)],
                              "pick": {"values": {"train.lr": lr}, "sets": [f"train.lr={lr}"],
                                       "score": 0.5}}
                          for m, lr in (("grpo", "5e-4"), ("focus", "1e-3"))}}
    (sweep / "tuning.json").write_text(json.dumps(tuning))
    out = tmp_path / "verdict-math.json"
    res = runner.invoke(app, ["diagnose", "table", "--record", str(out), "--reference", "grpo", str(sweep)])
    assert res.exit_code == 0, res.output
    rec = json.loads(out.read_text())
    assert rec["tuning"] == tuning and not records.check_record(rec)
    row = records.focus_verdict({"verdict-math": rec}).splitlines()[2]
    assert row.startswith("| `math` |") and "| 5e-4 / 1e-3 |" in row and "+5.0 ± 0.0 ahead" in row
    # the record's own table ends with the tuning stage, each method's pick in bold
    tail = records.record_table(rec).splitlines()[-1]
    assert tail.startswith("Tuning stage") and "`grpo` lr=2e-4 0.400; **lr=5e-4 0.500**" in tail
    assert "`focus` lr=2e-4 0.400; **lr=1e-3 0.500**" in tail
    # a tuning stage without its picks is not recorded: one line
    tuning["methods"]["focus"]["pick"] = None
    (sweep / "tuning.json").write_text(json.dumps(tuning))
    res = runner.invoke(app, ["diagnose", "table", "--record", str(tmp_path / "r.json"), str(sweep)])
    assert res.exit_code == 2 and "no pick yet for focus" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "r.json").exists()
