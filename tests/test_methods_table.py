"""benchmarks/methods_table.py: the verdict table's numbers from run folders (mean of checks,
paired differences against the reference over shared seeds, the ahead/level/behind rule)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("methods_table", ROOT / "benchmarks" / "methods_table.py")
mt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mt)


def _run(root: Path, method: str, seed: int, checks: list[float], tokens=100, s=2.0,
         zero: list[float] | None = None) -> Path:
    run = root / "cells" / method / f"seed-{seed}"
    run.mkdir(parents=True)
    rows = [{"step": 0, "eval/success": checks[0], "eval/success_se": 0.03,
             "eval/tokens_per_question": 40.0}]
    for i, c in enumerate(checks[1:], 1):
        rows.append({"step": i, "rollout/tokens": tokens, "time/step": s, "eval/success": c,
                     "eval/success_se": 0.05, "eval/tokens_per_question": 41.0})
        if zero is not None:
            rows[-1]["rollout/zero_spread_groups"] = zero[i - 1]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"method": method, "seed": seed}))
    return run


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
    runs = [mt.load_run(p) for p in mt.runs_under([tmp_path])]
    by = {}
    for r in runs:
        by.setdefault(r["label"], []).append(r)
    assert abs(by["grpo"][1]["mean_checks"] - 0.6) < 1e-12
    assert abs(by["grpo"][1]["final"] - by["grpo"][1]["base"] - 0.4) < 1e-12
    mean, se, n = mt.paired(by["a"], by["grpo"])
    assert n == 3 and abs(mean - 0.10) < 1e-9 and abs(se - 0.02 / 3 ** 0.5) < 1e-9
    assert mt.verdict((mean, se, n)) == "ahead"
    assert mt.verdict(mt.paired(by["b"], by["grpo"])) == "level"
    assert mt.verdict(mt.paired(by["c"], by["grpo"])) == "behind"
    # seeds the reference lacks are not paired; one shared seed gives no verdict
    assert mt.paired(by["a"][:1], by["grpo"]) is None and mt.verdict(None) == "–"
    lines = mt.table(runs, "grpo")
    row = next(x for x in lines if x.startswith("| `a`"))
    assert "+10.0 ± 1.2" in row and "| +50.7 ± 10.1 |" in row and "| ahead |" in row and "| 0.043 |" in row   # (0.03 + 0.05 + 0.05) / 3: every check, the base included
    c_row = next(x for x in lines if x.startswith("| `c`")).split(" | ")
    assert c_row[14] == "3.00 ± 0.00"
    assert c_row[10] == "–"       # runs that logged no rollout/zero_spread_groups: no mixed share
    assert c_row[11] == "–"       # a linear method launches no continuations
    assert c_row[12] == "–"       # ...and logs no critic rank
    assert "| +10.7 ± 0.7 |" in row    # the last check, paired: +0.10, +0.12, +0.10
    assert "| reference |" in next(x for x in lines if x.startswith("| `grpo`"))


def test_critic_rank_table_merges_seeds_per_step():
    spec = importlib.util.spec_from_file_location(
        "critic_rank_table", ROOT / "benchmarks" / "critic_rank_table.py")
    crt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(crt)

    def doc(rhos):
        return {"checkpoints": [{"step": 10 * (i + 1), "spearman": r, "mae": 0.2 + i / 10,
                                 "mean_critic": 0.5, "mean_target": 0.4 + i / 10}
                                for i, r in enumerate(rhos)]}

    lines = crt.table([doc([0.5, 0.1]), doc([0.3, None])]).splitlines()
    assert lines[2] == "| 10 | 0.50 / 0.30 | 0.40 | 0.20 | 0.50 | 0.40 |"
    assert lines[3] == "| 20 | 0.10 | 0.10 | 0.30 | 0.50 | 0.50 |"    # an undefined rho is left out


def test_tool_calls_table_spans_seeds_and_flags_a_collapse(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "tool_calls_table", ROOT / "benchmarks" / "tool_calls_table.py")
    tct = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tct)

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
    lines = tct.table(tct.collect([tmp_path], 2)).splitlines()
    assert "calls, steps 1-10 | calls, steps 11-20" in lines[0]
    focus = next(x for x in lines if x.startswith("| `focus`"))
    grpo = next(x for x in lines if x.startswith("| `grpo`"))
    assert focus.startswith("| `focus` | 0 | 6.00 | 7.00 | 0.25 | 0.50 | 8.00 / 7.00 | 0.30 / 0.50 | 0.50 | none |")
    assert grpo.startswith("| `grpo` | 0,1 | 8.00 | 4.50 |") and grpo.endswith("| 0 |")


def test_a_window_of_checks(tmp_path):
    run = _run(tmp_path, "grpo", 0, [0.3, 0.4, 0.6, 0.8])
    assert abs(mt.load_run(run)["mean_checks"] - 0.6) < 1e-12
    assert abs(mt.load_run(run, 2, 3)["mean_checks"] - 0.7) < 1e-12
    assert abs(mt.load_run(run, 0, 1)["mean_checks"] - 0.4) < 1e-12      # step 0 is the base, never a check


def test_the_mixed_outcome_share_is_the_mean_over_steps_of_groups_with_a_signal(tmp_path):
    _run(tmp_path, "grpo", 0, [0.3, 0.4, 0.5], zero=[0.25, 0.75])
    _run(tmp_path, "grpo", 1, [0.3, 0.4, 0.5], zero=[0.0, 0.5])
    runs = [mt.load_run(p) for p in mt.runs_under([tmp_path])]
    assert sorted(r["mixed"] for r in runs) == [0.5, 0.75]
    row = next(x for x in mt.table(runs, "grpo") if x.startswith("| `grpo`")).split(" | ")
    assert row[10] == "0.62 ± 0.18"


def test_continuations_by_depth_average_over_steps_and_seeds(tmp_path):
    for seed, rows in enumerate([[{0: 0.5, 1: 0.5}, {0: 1.0}], [{0: 0.25, 2: 0.5, 3: 0.25}]]):
        run = _run(tmp_path, "focus", seed, [0.1] * (len(rows) + 1))
        lines = (run / "metrics.jsonl").read_text().splitlines()
        out = [lines[0]]
        for line, shares in zip(lines[1:], rows):
            r = json.loads(line)
            r.update({f"focus/launch_share_depth{d}": v for d, v in shares.items()})
            out.append(json.dumps(r))
        (run / "metrics.jsonl").write_text("\n".join(out) + "\n")
    runs = [mt.load_run(p) for p in mt.runs_under([tmp_path])]
    assert runs[0]["depths"] == {0: 0.75, 1: 0.25}
    # seed 0: d0 .75 d1 .25; seed 1: d0 .25 d1 0 d2+ .75
    assert mt.depth_cell(runs) == "d0 0.50 d1 0.12 d2+ 0.38"


def test_the_allocation_map_pairs_each_arm_with_grpo_and_draws_its_figure(tmp_path):
    spec = importlib.util.spec_from_file_location("allocation_map", ROOT / "benchmarks" / "allocation_map.py")
    am = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(am)
    for seed in range(3):
        _run(tmp_path, "grpo", seed, [0.2, 0.3, 0.4], zero=[0.5, 0.5])
        _run(tmp_path, "focus", seed, [0.2, 0.35 + 0.01 * seed, 0.45], zero=[0.3, 0.3])
    dirs = am.mt.runs_under([tmp_path])
    runs = [am.mt.load_run(p) for p in dirs]
    (gain, se, n), = am.gains(runs, "grpo").values()
    # focus - grpo per seed: +0.05, +0.055, +0.06 (mean of checks over steps 1, 2)
    assert n == 3 and abs(gain - 5.5) < 1e-9 and abs(se - 0.5 / 3 ** 0.5) < 1e-9
    cur = am.curves(dirs)
    assert cur["grpo"][2] == [0.4, 0.4, 0.4] and len(cur["focus"][0]) == 3
    out = tmp_path / "map.png"
    am.plot(dirs, "grpo", out, "t")
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_tasks_per_step_counts_trees_or_groups_over_the_traced_steps(tmp_path):
    """What a step learnt from: a tree method's trees, else its episodes / group size (GRPO
    draws fresh tasks to spend its budget), averaged over the traced steps."""
    run = _run(tmp_path, "grpo", 0, [0.3, 0.4])
    assert mt.tasks_per_step(run) is None                    # no config, no traces
    (run / "config.json").write_text(json.dumps({"rollout": {"group_size": 4}}))
    (run / "traces").mkdir()
    for step, (eps, trees) in enumerate([(80, 0), (72, 0)], 1):
        (run / "traces" / f"step-{step:06d}.json").write_text(
            json.dumps({"episodes_in_step": eps, "trees_in_step": trees}))
    assert mt.tasks_per_step(run) == 19.0
    (run / "traces" / "step-000003.json").write_text(
        json.dumps({"episodes_in_step": 194, "trees_in_step": 4}))
    assert mt.tasks_per_step(run) == (20 + 18 + 4) / 3
    row = next(x for x in mt.table([mt.load_run(run)], "grpo") if x.startswith("| `grpo`"))
    assert "| 14.0 |" in row


def test_pass_at_k_of_the_last_checkpoint_in_the_table_and_the_record(tmp_path):
    """`--pass-k` keeps `agentrl eval`'s JSON in the run folder; the table and the record read
    the largest k of it, per seed, and the record's column names that k."""
    from agentrl_cli.reporting import records

    runs = []
    for seed, p4 in enumerate([0.6, 0.7]):
        run = _run(tmp_path, "grpo", seed, [0.3, 0.4])
        assert mt.pass_at_k(run) is None
        (run / mt.PASS_FILE).write_text(json.dumps({"pass@k": {"1": 0.4, "2": 0.5, "4": p4}}))
        runs.append(mt.load_run(run))
    assert mt.pass_at_k(tmp_path / "cells" / "grpo" / "seed-1") == (4, 0.7)
    row = next(x for x in mt.table(runs, "grpo") if x.startswith("| `grpo`"))
    assert "| @4 0.650 ± 0.071 |" in row
    rec = mt.record(runs, "grpo", [], "t", build="b", date="d")
    assert rec["arms"][0]["per_seed"]["pass_at_k"] == [0.6, 0.7] and rec["arms"][0]["pass_k"] == 4
    rec["columns"] = ["seeds", "pass_at_k"]
    text = records.record_table(rec)
    assert "| method | seeds | pass@4 at the end |" in text and "| 0.650 ± 0.071 |" in text


def test_the_critic_rank_is_the_mean_over_the_steps_that_logged_it(tmp_path):
    for seed, values in enumerate([[0.2, None], [0.5, 0.1]]):
        run = _run(tmp_path, "focus", seed, [0.1, 0.2, 0.3])
        lines = (run / "metrics.jsonl").read_text().splitlines()
        out, k = [lines[0]], 0
        for line in lines[1:]:
            r = json.loads(line)
            if "rollout/tokens" in r and k < len(values):
                if values[k] is not None:
                    r["focus/critic_rank"] = values[k]
                k += 1
            out.append(json.dumps(r))
        (run / "metrics.jsonl").write_text("\n".join(out) + "\n")
    _run(tmp_path, "grpo", 0, [0.1, 0.2, 0.3])
    runs = [mt.load_run(p) for p in mt.runs_under([tmp_path])]
    by = {(r["label"], r["seed"]): r["critic_rank"] for r in runs}
    assert by[("focus", 0)] == 0.2 and abs(by[("focus", 1)] - 0.3) < 1e-12
    assert by[("grpo", 0)] is None
    lines = mt.table(runs, "grpo")
    col = lines[0].split(" | ").index("critic rank (rho)")
    assert next(x for x in lines if x.startswith("| `focus`")).split(" | ")[col] == "0.25 ± 0.07"
    assert next(x for x in lines if x.startswith("| `grpo`")).split(" | ")[col] == "–"
