"""docs/records and the pages built from them: the README's and results.md's generated sections
agree with the records, a planted mismatch (in a page or in a record) is caught, the verdict
words follow the declared standard, and run folders become a record without hand typing."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl_cli.reporting import records

ROOT = Path(__file__).resolve().parents[1]


def _methods_table():
    spec = importlib.util.spec_from_file_location("methods_table", ROOT / "benchmarks" / "methods_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _copy(tmp_path: Path) -> Path:
    """The pages and records in a scratch repository root."""
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    for page in records.RESULTS_PAGES:
        shutil.copy(ROOT / page, tmp_path / page)
    shutil.copytree(ROOT / "docs" / "records", tmp_path / "docs" / "records")
    for page in ("methods.md", "envs.md"):               # pages whose prose quotes records
        shutil.copy(ROOT / "docs" / page, tmp_path / "docs" / page)
    return tmp_path


def test_pages_agree_with_the_records():
    """`python -m agentrl_cli.reporting.records` rewrites these sections; run it after adding
    or changing a record."""
    assert records.stale(ROOT) == []
    for page in records.PAGES:
        text = (ROOT / page).read_text()
        assert records.SECTION.search(text), f"{page} has no generated section"


def test_every_results_table_comes_from_a_record():
    text = "".join((ROOT / page).read_text() for page in records.RESULTS_PAGES)
    keys = records.SECTION.findall(text)
    names = {p.stem for p in (ROOT / "docs" / "records").glob("*.json")}
    assert {k.split(":", 1)[1] for k in keys if k.startswith("table:")} <= names
    # every record is shown on the results page: as its own table, or as a row of the table of
    # task suites from outside (whose commands and per-seed values the research log holds)
    shown = {k.split(":", 1)[1] for k in keys if k.startswith("table:")}
    if "external" in keys:
        shown |= {key for _, key in records.EXTERNAL}
    if "focus-verdict" in keys:
        shown |= {key for _, key in records.VERDICT}
    assert names <= shown


def test_a_record_on_neither_results_page_is_caught(tmp_path):
    """A record's table may stand on either results page, not on none."""
    root = _copy(tmp_path)
    assert records.problems(root) == []
    page = root / "docs" / "results-runs.md"
    text = page.read_text()
    begin = text.index("<!-- from docs/records: table:families-math -->")
    end = text.index("<!-- end: table:families-math -->") + len("<!-- end: table:families-math -->")
    page.write_text(text[:begin] + text[end:])
    assert any("table:families-math on docs/results.md or docs/results-runs.md" in p
               for p in records.problems(root))
    # the same table moved to the other page is shown
    results = root / "docs" / "results.md"
    results.write_text(results.read_text().replace("<!-- end of page -->",
                                                   text[begin:end] + "\n\n<!-- end of page -->"))
    assert records.problems(root) == []


def test_the_verdict_bar_is_open_until_every_family_has_run():
    recs = records.load_records(ROOT / "docs" / "records")
    rec = {"title": "t", "build": "abc1234", "budget": 100,
           "arms": [{"name": "grpo", "seeds": [0, 1, 2],
                     "per_seed": {"mean_of_checks": [0.5, 0.6, 0.7], "tokens_per_step": [100, 100, 100]}},
                    {"name": "focus", "seeds": [0, 1, 2], "reference": "grpo",
                     "per_seed": {"mean_of_checks": [0.55, 0.65, 0.76], "tokens_per_step": [100, 101, 99]}}]}
    some = {**{k: v for k, v in recs.items() if k not in dict(records.VERDICT).values()},
            "verdict-math": rec}
    assert "**open**: not run on `rules`, `search`, `locate`" in records.focus_verdict(some)
    every = {**recs, **{key: rec for _, key in records.VERDICT}}
    assert "The bar: **met**." in records.focus_verdict(every)     # +5.3 points, ahead everywhere
    behind = {**every, "verdict-rules": {**rec, "arms": [rec["arms"][1] | {"name": "grpo", "reference": None},
                                                         rec["arms"][0] | {"name": "focus", "reference": "grpo"}]}}
    assert "**not met**: behind or off the budget on `rules` (behind)" in records.focus_verdict(behind)
    level = {**every, "verdict-math": {**rec, "arms": [rec["arms"][0], rec["arms"][0] | {"name": "focus", "reference": "grpo"}]}}
    assert "ahead on no family" not in records.focus_verdict(level)   # the others are 5 ahead


def test_a_number_edited_in_a_page_is_caught(tmp_path):
    root = _copy(tmp_path)
    readme = (root / "README.md").read_text()
    assert "| 1.22x |" in readme
    (root / "README.md").write_text(readme.replace("| 1.22x |", "| 1.19x |", 1))
    assert records.stale(root) == ["README.md"]
    results = (root / "docs" / "results.md").read_text()
    assert "| +0.7 ± 0.8 | level |" in results
    (root / "docs" / "results.md").write_text(results.replace("| +0.7 ± 0.8 | level |",
                                                              "| +2.1 ± 1.0 | ahead |", 1))
    assert records.stale(root) == ["README.md", "docs/results.md"]
    records.write(root)
    assert records.stale(root) == []
    assert "| 1.22x |" in (root / "README.md").read_text()


def test_a_number_edited_in_a_record_is_caught(tmp_path):
    root = _copy(tmp_path)
    path = root / "docs" / "records" / "search-main.json"
    rec = json.loads(path.read_text())
    rec["arms"][1]["per_seed"]["wall_s"][0] = 300          # focus seed 0: 208 -> 300 s
    path.write_text(json.dumps(rec))
    assert records.stale(root) == ["README.md", "docs/results.md"]
    records.write(root)
    assert "| 1.41x |" in (root / "README.md").read_text()   # (300 + 210 + 175) / 486


def test_a_transcription_that_does_not_give_its_summary_is_refused(tmp_path):
    root = _copy(tmp_path)
    path = root / "docs" / "records" / "methods-search.json"
    rec = json.loads(path.read_text())
    focus = next(a for a in rec["arms"] if a["name"] == "focus")
    focus["per_seed"]["mean_of_checks"][0] = 0.692          # the page printed 0.606 ± 0.019
    path.write_text(json.dumps(rec))
    with pytest.raises(ValueError, match="focus: per-seed mean_of_checks"):
        records.load_records(root / "docs" / "records")
    focus["per_seed"]["mean_of_checks"] = [0.6]            # one value for three seeds
    path.write_text(json.dumps(rec))
    with pytest.raises(ValueError, match="1 values of mean_of_checks for 3 seeds"):
        records.load_records(root / "docs" / "records")


def _rec(diffs_vs: list[float], tokens: float = 100.0) -> dict:
    """A record whose arm `a` differs from `ref` by `diffs_vs` (fractions) seed by seed."""
    ref = [0.5, 0.6, 0.7]
    return {"budget": 100, "arms": [
        {"name": "ref", "label": "ref", "seeds": [0, 1, 2],
         "per_seed": {"mean_of_checks": ref, "tokens_per_step": [100, 100, 100]}},
        {"name": "a", "label": "a", "seeds": [0, 1, 2], "reference": "ref",
         "per_seed": {"mean_of_checks": [r + d for r, d in zip(ref, diffs_vs)],
                      "tokens_per_step": [tokens] * 3}}]}


def test_verdict_words_follow_the_standard():
    ahead = _rec([0.10, 0.12, 0.08])                 # +10.0 ± 1.2 points
    mean, se = records.paired(ahead, ahead["arms"][1], "mean_of_checks")
    assert abs(mean - 10.0) < 1e-9 and abs(se - 2 / 3 ** 0.5) < 1e-9
    assert records.verdict(ahead, ahead["arms"][1]) == "ahead"
    assert records.verdict(*(lambda r: (r, r["arms"][1]))(_rec([0.10, -0.10, 0.0]))) == "level"
    assert records.verdict(*(lambda r: (r, r["arms"][1]))(_rec([-0.05, -0.06, -0.04]))) == "behind"
    # the same lead at 16% more tokens is no verdict; within 5% it is
    over = _rec([0.10, 0.12, 0.08], tokens=116)
    assert records.verdict(over, over["arms"][1]) == "off the budget (+16% tokens)"
    assert records.verdict(*(lambda r: (r, r["arms"][1]))(_rec([0.10, 0.12, 0.08], 104))) == "ahead"
    # a summary the measuring table printed wins over rounded per-seed values
    given = _rec([0.004, 0.010, 0.006])
    assert records.cell(given, given["arms"][1], "vs_ref") == "+0.7 ± 0.2"
    given["arms"][1]["given"] = {"vs_ref": [0.6, 0.2]}
    assert records.cell(given, given["arms"][1], "vs_ref") == "+0.6 ± 0.2"
    assert records.check_record({**given, "title": "t", "date": "d", "build": "b", "env": "e",
                                 "steps": 1, "commands": [], "source": "s"}) == []


def test_windows_are_printed_as_exploration_not_verdict():
    rec = json.loads((ROOT / "docs" / "records" / "search-long-200.json").read_text())
    text = records.record_table(rec)
    table, _, after = text.partition("\nExploration")
    assert "checks 110-200" not in table and "checks 110-200 +2.1 ± 1.0" in after
    assert "not a verdict" in after


def _run(root: Path, method: str, seed: int, checks: list[float], wall: float) -> Path:
    run = root / "cells" / method / f"seed-{seed}"
    run.mkdir(parents=True)
    rows = [{"step": 0, "eval/success": checks[0], "eval/tokens_per_question": 40.0}]
    for i, c in enumerate(checks[1:], 1):
        rows.append({"step": i, "rollout/tokens": 100 + seed, "time/step": 1.0,
                     "eval/success": c, "eval/tokens_per_question": 41.0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({
        "method": method, "seed": seed, "env": "search", "steps": len(checks) - 1,
        "budget_tokens": 101, "wall_seconds": wall}))
    return run


def test_a_record_from_run_folders(tmp_path):
    """`agentrl diagnose table --record` reads the run folders and writes a record the pages take."""
    from typer.testing import CliRunner

    from agentrl_cli.cli.main import app

    runs = tmp_path / "sweep"
    for seed, (g, f) in enumerate([([0.3, 0.4, 0.6], [0.3, 0.5, 0.7]),
                                   ([0.3, 0.5, 0.7], [0.3, 0.62, 0.82]),
                                   ([0.3, 0.6, 0.8], [0.3, 0.66, 0.9])]):
        _run(runs, "grpo", seed, g, 150.0 + seed)
        _run(runs, "focus", seed, f, 180.0 + seed)
    out = tmp_path / "rec.json"
    res = CliRunner().invoke(app, ["diagnose", "table", "--record", str(out), "--command",
                                   "agentrl ablate --method focus,grpo", str(runs)])
    assert res.exit_code == 0, res.output
    rec = json.loads(out.read_text())
    assert records.check_record(rec) == []
    assert (rec["env"], rec["steps"], rec["budget"]) == ("search", 2, 101)
    assert rec["commands"][0] == "agentrl ablate --method focus,grpo"
    focus = next(a for a in rec["arms"] if a["name"] == "focus")
    assert focus["reference"] == "grpo" and focus["seeds"] == [0, 1, 2]
    assert focus["per_seed"]["mean_of_checks"] == pytest.approx([0.6, 0.72, 0.78])
    assert focus["per_seed"]["wall_s"] == [180.0, 181.0, 182.0]
    table = records.record_table(rec)
    assert "| `focus` | 0-2 | 0.700 ± 0.092 | +50.7 ± 10.1 | +10.0 ± 1.2 | ahead | +10.7 ± 0.7 |" in table
    assert records.wall_ratio(rec, "focus", "grpo") == pytest.approx(543 / 453)
    bad = CliRunner().invoke(app, ["diagnose", "table", "--record", str(out), "--checks", "1-1",
                                   str(runs)])
    assert bad.exit_code == 2 and "exploration" in bad.output


def test_the_check_command_names_a_stale_page(tmp_path):
    root = _copy(tmp_path)
    (root / "README.md").write_text((root / "README.md").read_text().replace("| 1.22x |", "| 9x |"))
    res = subprocess.run([sys.executable, "-m", "agentrl_cli.reporting.records", "--check"],
                         capture_output=True, text=True, cwd=root)
    assert res.returncode == 1 and res.stdout.startswith("README.md: generated sections disagree")


def test_other_pages_quote_the_records_budgets():
    """The guides quote a budget in prose; it is the records' matched budget."""
    recs = records.load_records(ROOT / "docs" / "records")
    long_budget = recs[records.LONG]["budget"]
    assert f"budget ({long_budget:,} generated tokens" in (ROOT / "docs" / "envs.md").read_text()
    main_budget = recs[records.METHODS]["budget"]
    assert f"tokens per step at its budget of {main_budget:,}" in (ROOT / "docs" / "methods.md").read_text()


def test_the_families_table_pairs_each_method_with_grpo_per_family():
    """One row per task family from its record: GRPO's own gain, then FOCUS / VinePPO / PPO
    against GRPO with the standard's word; a family with no record, or a method a record lacks,
    is said to be not run."""
    def arm(name, mean_of_checks, ref="grpo"):
        return {"name": name, "label": name, "seeds": [0, 1, 2], "reference": ref,
                "per_seed": {"mean_of_checks": mean_of_checks, "base": [0.2] * 3,
                             "final": [0.4, 0.35, 0.45], "tokens_per_step": [100] * 3}}
    grpo = arm("grpo", [0.30, 0.32, 0.28], None)
    rec = {"title": "t", "date": "d", "build": "abc1234", "env": "math", "steps": 100,
           "budget": 100, "commands": [], "source": "s",
           "arms": [grpo, arm("focus", [0.20, 0.23, 0.19]), arm("ppo", [0.30, 0.33, 0.28])]}
    rows = {line.split(" | ")[0].strip("| `"): line
            for line in records.families({"families-math": rec}).splitlines()[2:]}
    assert set(rows) == {"search", "math", "rules", "locate"}
    math = rows["math"].split(" | ")
    assert math[1] == "`abc1234`" and math[3].startswith("0.300") and math[4].startswith("+20.0")
    assert math[5] == "-9.3 ± 0.3 behind" and math[6] == "not run"
    assert math[7].startswith("+0.3 ± 0.3 level") and math[8] == "not run" and math[9] == "not run |"
    assert "not run" in rows["search"] and "not run" in rows["rules"]


def test_the_external_table_pairs_focus_with_grpo_per_task():
    """One row per external task from its record: its start per seed, GRPO's mean of checks and
    gain, FOCUS against GRPO with the standard's word; a task with no record is not run."""
    def arm(name, mean_of_checks, ref="grpo"):
        return {"name": name, "label": name, "seeds": [0, 1, 2], "reference": ref,
                "per_seed": {"mean_of_checks": mean_of_checks, "base": [0.2, 0.25, 0.3],
                             "final": [0.4, 0.35, 0.45], "tokens_per_step": [100] * 3}}
    rec = {"title": "t", "date": "d", "build": "abc1234", "env": "reasoning-gym:chain_sum",
           "steps": 100, "budget": 100, "commands": [], "source": "s",
           "arms": [arm("grpo", [0.30, 0.32, 0.28], None), arm("focus", [0.20, 0.23, 0.19])]}
    task, key = records.EXTERNAL[0]
    rows = {line.split(" | ")[0].strip("| `"): line.split(" | ")
            for line in records.external({key: rec}).splitlines()[2:]}
    assert set(rows) == {t for t, _ in records.EXTERNAL}
    row = rows[task]
    assert row[1] == "`abc1234`" and row[3] == "0.200 / 0.250 / 0.300"
    assert row[4] == "0.300 ± 0.020" and row[5] == "+15.0 ± 5.0"   # std over seeds
    assert row[6].rstrip(" |") == "-9.3 ± 0.3 behind"   # paired: -10, -9, -9; se 0.33
    other = rows[records.EXTERNAL[1][0]]
    assert other[4] == "not run" and other[1] == "–"


# ---- the check without holes: each fault one line, exit 1, no traceback -------------------

def _check(root: Path, *args: str) -> tuple[int, list[str]]:
    res = subprocess.run([sys.executable, "-m", "agentrl_cli.reporting.records", *args],
                         capture_output=True, text=True, cwd=root)
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, (res.stdout + res.stderr).splitlines()


def test_the_check_passes_on_the_repository_and_results_stay_small():
    assert records.problems(ROOT) == []
    assert len((ROOT / "docs" / "results.md").read_bytes()) < 30_000


def test_a_number_quoted_in_prose_is_checked_and_rewritten(tmp_path):
    root = _copy(tmp_path)
    results = root / "docs" / "results.md"
    text = results.read_text()
    assert "on `rules` +10.6 ± 6.3 from 0.304" in text
    results.write_text(text.replace("on `rules` +10.6 ± 6.3 from 0.304", "on `rules` +12.6 ± 6.3 from 0.304"))
    rc, lines = _check(root, "--check")
    assert rc == 1 and lines == ["docs/results.md: '+12.6 ± 6.3' where docs/records gives '+10.6 ± 6.3' "
                                 "(families-rules:grpo:final_minus_base)"]
    # a guide's prose too, across a line break
    methods = root / "docs" / "methods.md"
    methods.write_text(methods.read_text().replace("`rules` (-2.4 ± 1.6)", "`rules` (-0.4 ± 1.6)"))
    rc, lines = _check(root, "--check")
    assert rc == 1 and "docs/methods.md: '-0.4 ± 1.6' where docs/records gives '-2.4 ± 1.6' " \
        "(families-rules:focus:vs_ref)" in lines
    assert _check(root) == (0, [f"wrote {root / 'docs' / 'results.md'}", f"wrote {methods}"])
    assert "on `rules` +10.6 ± 6.3 from 0.304" in results.read_text()
    assert _check(root, "--check") == (0, [])


def test_a_record_changed_reaches_its_quotes_and_a_reworded_quote_is_named(tmp_path):
    root = _copy(tmp_path)
    path = root / "docs" / "records" / "allocation-early.json"
    rec = json.loads(path.read_text())
    tree = next(a for a in rec["arms"] if a["name"] == "tree_grpo")
    tree["per_seed"]["mean_of_checks"] = [x - 0.01 for x in tree["per_seed"]["mean_of_checks"]]
    tree.get("given", {}).pop("vs_ref", None)
    tree.get("given", {}).pop("mean_of_checks", None)
    path.write_text(json.dumps(rec))
    rc, lines = _check(root, "--check")
    assert rc == 1 and any(line.startswith("docs/methods.md: '+2.7 ± 0.5' where docs/records "
                                           "gives '+3.7 ± 0.5'") for line in lines), lines
    envs = root / "docs" / "envs.md"
    envs.write_text(envs.read_text().replace("budget (4,063 generated tokens", "budget of 4,063 tokens"))
    rc, lines = _check(root, "--check")
    assert rc == 1 and "docs/envs.md: a quote of the records is gone or reworded (change QUOTES in " \
        "agentrl_cli/reporting/records.py with it): budget (… generated tokens" in lines


def test_an_emptied_or_truncated_results_page_is_caught(tmp_path):
    root = _copy(tmp_path)
    results = root / "docs" / "results.md"
    full = results.read_text()
    results.write_text("")
    assert _check(root, "--check") == (1, ["docs/results.md: empty"])
    # cut after its last generated section: only the end line says so
    results.write_text(full[:full.index("## Caveats")])
    assert _check(root, "--check") == (1, ["docs/results.md: truncated (its last line is not "
                                           "<!-- end of page -->)"])
    # cut in the middle: the sections it lost are named
    results.write_text(full[:len(full) // 2])
    rc, lines = _check(root, "--check")
    assert rc == 1 and lines[0] == "docs/results.md: truncated (its last line is not <!-- end of page -->)"
    assert "docs/results.md: no generated section table:search-main on docs/results.md or " \
        "docs/results-runs.md (cut short, or its markers removed)" in lines
    assert _check(root) == (1, lines)            # rewriting refuses too, the same lines


def test_a_missing_marker_is_one_line(tmp_path):
    root = _copy(tmp_path)
    results = root / "docs" / "results.md"
    full = results.read_text()
    results.write_text(full.replace("<!-- end: table:dapo-budget -->\n", "", 1))
    assert _check(root, "--check") == (1, ["docs/results.md: section table:dapo-budget has no end "
                                           "marker (<!-- end: table:dapo-budget -->)"])
    results.write_text(full.replace("<!-- from docs/records: table:dapo-budget -->\n", "", 1))
    assert _check(root, "--check") == (1, ["docs/results.md: section table:dapo-budget has no begin "
                                           "marker (<!-- from docs/records: table:dapo-budget -->)"])
    results.write_text(full.replace("table:dapo-budget -->", "table:dapo-budgett -->"))
    rc, lines = _check(root, "--check")
    assert rc == 1 and lines == [
        "docs/results.md: section table:dapo-budgett names no record in docs/records",
        "docs/results.md: no generated section table:dapo-budget on docs/results.md or "
            "docs/results-runs.md (cut short, or its markers removed)"]


@pytest.mark.parametrize("edit, line", [
    (lambda text: text[:40], "docs/records/dapo-budget.json: not JSON (line 2, column"),
    (lambda text: "[1, 2]", "docs/records/dapo-budget.json: not a JSON object"),
    (lambda text: json.dumps({**json.loads(text), "arms": "grpo"}), "docs/records/dapo-budget.json: no arms"),
    (lambda text: text.replace('"seeds"', '"seedz"', 1), "docs/records/dapo-budget.json: arm grpo: no seeds"),
    (lambda text: json.dumps({**json.loads(text), "arms": [{**json.loads(text)["arms"][0], "per_seed": {
        "base": "0.3"}}]}), "docs/records/dapo-budget.json: arm grpo: per_seed.base is not a list of numbers"),
])
def test_a_malformed_record_is_one_line(tmp_path, edit, line):
    root = _copy(tmp_path)
    path = root / "docs" / "records" / "dapo-budget.json"
    path.write_text(edit(path.read_text()))
    for args in (("--check",), ()):
        rc, lines = _check(root, *args)
        assert rc == 1 and len(lines) == 1 and lines[0].startswith(line), lines


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_nan_in_a_record_is_one_line(tmp_path, value):
    root = _copy(tmp_path)
    path = root / "docs" / "records" / "search-main.json"
    rec = json.loads(path.read_text())
    rec["arms"][1]["per_seed"]["wall_s"][0] = "HERE"
    path.write_text(json.dumps(rec).replace('"HERE"', value))
    rc, lines = _check(root, "--check")
    assert rc == 1 and len(lines) == 1, lines
    assert lines[0].startswith("docs/records/search-main.json: ") and "not a" in lines[0]
    with pytest.raises(records.RecordError, match="search-main.json"):
        records.load_records(root / "docs" / "records")


def test_a_missing_readme_is_one_line(tmp_path):
    root = _copy(tmp_path)
    (root / "README.md").unlink()
    assert _check(root, "--check") == (1, ["README.md: missing (python -m agentrl_cli.reporting.records "
                                           "checks it)"])
    (root / "docs" / "records" / "search-main.json").unlink()
    (root / "README.md").write_text((ROOT / "README.md").read_text())
    rc, lines = _check(root, "--check")
    assert rc == 1 and "README.md: its sections cannot be rendered from docs/records (KeyError: " \
        "search-main)" in lines
