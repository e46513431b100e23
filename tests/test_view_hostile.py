"""`agentrl view` on folders a careless or hostile user hands it (built by hand here): it never
stops on a bad file (NaN, deep JSON, wrong types, a trace off its schema), lists what it could
not read on the page, follows no symbolic link and reads nothing outside the folder, keeps its
caps on any metrics size, keeps control characters off the page, writes the page whole or not
at all, and `--text` explains its symbols. The page in a browser: tests/test_view_browser.py."""
from __future__ import annotations

import errno
import json
import os
import re
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl_cli.cli.main import app
from agentrl_cli.reporting import metric_rows, trace_schema
from agentrl_cli.reporting import view as view_mod

SECRET = "do-not-show-7f3a"


def node(i: int, parent: int, depth: int, children: list[int], **kw) -> dict:
    base = {"id": i, "parent": parent, "depth": depth, "children": children, "v": 0.5,
            "V_tilde": 0.6, "G_bar": 0.7, "n": 2, "cbar": 0.5, "g": 0.01, "reward": None,
            "launched": 0, "launch_order": [], "action": f"search(x{i})", "observation": "doc",
            "advantage": 0.25, "path": 0, "row": 0, "tool_calls": depth}
    return {**base, **kw}


def hand_tree() -> dict:
    """Root 0 -> inner 1 (a continuation launched from it) -> leaves 2, 3 (the same: they
    fold into one line in `--text`); root -> leaf 4."""
    nodes = [node(0, -1, 0, [1, 4], action=None, observation=None, advantage=None,
                  launched=1, launch_order=[1]),
             node(1, 0, 1, [2, 3], launched=1, launch_order=[2]),
             node(2, 1, 2, [], reward=1.0, v=None, model_answer="Ada", action="answer(Ada)"),
             node(3, 1, 2, [], reward=1.0, v=None, model_answer="Ada", action="answer(Ada)"),
             node(4, 0, 1, [], reward=0.0, v=None, model_answer="Bob", action="answer(Bob)")]
    return {"task_id": "t0", "group": 0, "question": "who?", "gold_answer": "Ada", "nodes": nodes,
            "paths": {"0": [0, 1, 2], "1": [0, 1, 3], "2": [0, 4]},
            "budget_by_depth": [{"depth": None, "paths": 2, "tokens": 30},
                                {"depth": 0, "paths": 1, "tokens": 10}]}


def hand_episode() -> dict:
    tokens = ["<q>", "who", "search(x1)", "doc", "answer(Ada)"]
    return {"row": 0, "group": 0, "task_id": "t0", "question": "who?", "gold_answer": "Ada",
            "model_answer": "Ada", "reward": 1.0, "success": True, "finish": "answer",
            "num_tool_calls": 1, "generated_tokens": 2, "trained_tokens": 2, "path": 0, "origin": 0,
            "turns": [{"start": 2, "end": 3, "action": "search(x1)", "observation": "doc",
                       "tool": "search", "advantage": 0.25},
                      {"start": 4, "end": 5, "action": "answer(Ada)", "observation": "",
                       "tool": None, "advantage": None}],
            "tokens": tokens, "response_mask": [0, 0, 1, 0, 1], "advantages": [0, 0, 0.25, 0, 0.5],
            "tokens_left_out": 0}


def hand_trace(step: int) -> dict:
    return {"format": 1, "step": step, "method": "focus", "episodes_in_step": 4, "trees_in_step": 1,
            "trees": [hand_tree()], "episodes": [hand_episode()],
            "critic": {"source": "tree nodes", "v": [0.5, 0.5], "outcome": [0.3, 0.5],
                       "leaves": [3, 2], "depth": [0, 1]},
            "budget_by_depth": [{"depth": None, "paths": 2, "tokens": 30}],
            "left_out": {"episodes": 0, "trees": 0}}


def make_run(folder: Path, traces=(1,)) -> Path:
    """A small run folder that `agentrl view` reads without a problem."""
    (folder / "traces").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(
        {"method": "focus", "seed": 3, "env": {"name": "search"}, "model": {"name": "tiny"},
         "train": {"steps": 4, "trace_every": 2}}))
    (folder / "summary.json").write_text(json.dumps(
        {"method": "focus", "base_success": 0.2, "final_success": 0.4, "tokens_generated": 900}))
    rows = [{"step": s, "reward/mean": 0.1 * s, "loss/policy": 0.5} for s in range(1, 5)]
    rows[1]["eval/success"] = 0.4
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for s in traces:
        write_trace(folder, s, hand_trace(s))
    return folder


def write_trace(run: Path, step: int, data) -> Path:
    p = run / "traces" / f"step-{step:06d}.json"
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


def view(folder: Path, *args: str):
    r = CliRunner().invoke(app, ["view", str(folder), *args])
    return r, r.stdout + (r.stderr if r.stderr_bytes is not None else "")


def page_data(html_file: Path) -> dict:
    html = html_file.read_text(encoding="utf-8")
    return json.loads(html.split('id="data">')[1].split("</script>")[0])


def problems(data: dict) -> dict[str, str]:
    """file -> its reasons, joined."""
    out: dict[str, str] = {}
    for p in data["problems"]:
        out[p["file"]] = out.get(p["file"], "") + p["reason"] + "; "
    return out


def test_a_clean_hand_made_run_has_no_problems(tmp_path):
    run = make_run(tmp_path / "run")
    r, out = view(run)
    assert r.exit_code == 0, out
    data = page_data(run / "report.html")
    assert data["problems"] == [] and len(data["traces"]) == 1 and len(data["metrics"]) == 4
    assert "could not read" not in out


def test_nan_and_infinity_show_as_missing(tmp_path):
    run = make_run(tmp_path / "run", traces=())
    (run / "metrics.jsonl").write_text('{"step": 1, "loss/policy": NaN, "reward/mean": 0.5}\n'
                                       '{"step": 2, "loss/policy": Infinity, "adv/std": 1e999}\n'
                                       '{"step": 3, "loss/policy": -Infinity}\n')
    (run / "summary.json").write_text('{"method": "focus", "final_success": NaN, "base_success": 0.25}')
    trace = json.dumps(hand_trace(1)).replace('"v": 0.5', '"v": NaN', 1).replace(
        '"reward": 1.0', '"reward": Infinity', 1)
    write_trace(run, 1, trace)
    r, out = view(run)
    assert r.exit_code == 0, out
    data = page_data(run / "report.html")
    assert data["problems"] == []
    assert data["metrics"] == [{"step": 1.0, "reward/mean": 0.5}, {"step": 2.0}, {"step": 3.0}]
    assert data["summary"]["final_success"] is None and data["summary"]["base_success"] == 0.25
    nodes = data["traces"][0]["trees"][0]["nodes"]
    assert nodes[0]["v"] is None and nodes[2]["reward"] is None
    r, out = view(run, "--text", "--tree", "0")
    assert r.exit_code == 0 and "[0] root  ·  v –  Ṽ 0.60" in out, out


def test_deeply_nested_json_is_refused_per_file(tmp_path):
    run = make_run(tmp_path / "run", traces=(1, 2))
    (run / "config.json").write_text("[" * 200_000 + "]" * 200_000)
    write_trace(run, 2, '{"step": 2, "trees": ' + "[" * 5000 + "]" * 5000 + "}")
    (run / "metrics.jsonl").write_text('{"step": 1, "x": 1}\n' + '{"step": 2, "deep": '
                                       + "[" * 3000 + "]" * 3000 + "}\n" + '{"step": 3, "x": 2}\n')
    r, out = view(run)
    assert r.exit_code == 0, out
    data = page_data(run / "report.html")
    got = problems(data)
    assert "nested deeper than 64 levels" in got["config.json"]
    assert "nested deeper than 64 levels" in got["traces/step-000002.json"]
    assert "not JSON objects" in got["metrics.jsonl"]
    assert [t["step"] for t in data["traces"]] == [1] and len(data["metrics"]) == 2
    assert data["method"] == "focus"              # from summary.json, config.json being unreadable
    r, out = view(run, "--text", "--step", "2")
    assert r.exit_code == 2 and "nested deeper" in out and "Traceback" not in out


def test_wrong_types_in_config_and_summary_are_listed(tmp_path):
    run = make_run(tmp_path / "run")
    (run / "config.json").write_text(json.dumps({"method": 5, "env": [1], "model": "tiny",
                                                 "seed": "zero", "train": {"steps": "many"}}))
    (run / "summary.json").write_text(json.dumps({"method": {"a": 1}, "env": "search",
                                                  "final_success": "high", "notes": [1, 2]}))
    r, out = view(run)
    assert r.exit_code == 0, out
    assert "file problems listed in it" in out
    data = page_data(run / "report.html")
    got = problems(data)
    for says in ("method is a number, not a string", "env is a list, not an object",
                 "model is a string, not an object", "seed is a string, not an integer",
                 "train.steps is a string, not an integer"):
        assert says in got["config.json"], (says, got)
    for says in ("method is an object", "final_success is a string, not a number", "notes is a list"):
        assert says in got["summary.json"], (says, got)
    assert data["env"] == "search" and data["method"] is None and "notes" not in data["summary"]
    (run / "config.json").write_text("[1, 2]")
    (run / "summary.json").write_text('"text"')
    r, out = view(run)
    got = problems(page_data(run / "report.html"))
    assert r.exit_code == 0 and "a list, not an object" in got["config.json"]
    assert "a string, not an object" in got["summary.json"]


def make_sweep(folder: Path, cells: list, names=("a", "b")) -> Path:
    for name in names:
        make_run(folder / "cells" / name / "seed-0", traces=())
    (folder / "ablation.json").write_text(json.dumps({"seeds": [0], "budget_tokens": 100,
                                                      "cells": cells}))
    return folder


def test_wrong_types_in_ablation_json_are_listed(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", [{"name": ["x"]}, 7, {"name": "a", "params": {"k": [1]}},
                                            {"name": "b", "method": "grpo", "params": {"k": "1"}}])
    r, out = view(sweep)
    assert r.exit_code == 0, out
    data = page_data(sweep / "report.html")
    got = problems(data)["ablation.json"]
    assert "cells[0]" in got and "cells[1]" in got and "cells[2]" in got and "cells[3]" not in got
    assert [c["name"] for c in data["cells"]] == ["b", "a"]      # listed first, then found
    assert data["cells"][0]["params"] == {"k": "1"} and len(data["cells"][1]["runs"]) == 1
    (sweep / "ablation.json").write_text(json.dumps({"cells": 5, "seeds": "x", "budget_tokens": []}))
    r, out = view(sweep)
    data = page_data(sweep / "report.html")
    got = problems(data)["ablation.json"]
    assert r.exit_code == 0 and "cells is a number, not a list" in got and "seeds is a string" in got
    assert "budget_tokens is a list" in got and data["seeds"] is None
    assert sorted(c["name"] for c in data["cells"]) == ["a", "b"]


def test_a_trace_off_its_schema_is_listed_and_the_rest_is_shown(tmp_path):
    run = make_run(tmp_path / "run", traces=(1,))
    loop = hand_trace(2)
    loop["trees"][0]["nodes"][1]["children"] = [0, 2, 3]
    short = hand_trace(3)
    short["episodes"][0]["advantages"] = [0.1]
    wrong = hand_trace(4)
    wrong["trees"][0]["nodes"][2]["v"] = "high"
    for step, data in ((2, loop), (3, short), (4, wrong), (5, {"step": 5, "trees": "x"})):
        write_trace(run, step, data)
    write_trace(run, 6, b"\xff\xfe not utf-8".decode("latin-1"))
    r, out = view(run)
    assert r.exit_code == 0, out
    data = page_data(run / "report.html")
    got = problems(data)
    assert [t["step"] for t in data["traces"]] == [1] and data["traced_steps"] == [1, 2, 3, 4, 5, 6]
    assert "trees[0].nodes[1].children" in got["traces/step-000002.json"]
    assert "episodes[0]: tokens, response_mask and advantages" in got["traces/step-000003.json"]
    assert "trees[0].nodes[2].v: not a number or null" in got["traces/step-000004.json"]
    assert "trace.trees: not a list" in got["traces/step-000005.json"]
    assert "traces/step-000006.json" in got
    for step in (2, 3, 4, 5):
        r, out = view(run, "--text", "--step", str(step), "--tree", "0")
        assert r.exit_code == 2 and "not a readable trace" in out and out.count("\n") == 1, out


def test_a_deep_tree_prints_in_linear_time_and_a_too_deep_one_is_refused(tmp_path):
    def chain(depth: int) -> dict:
        nodes = [node(i, i - 1, i, [i + 1] if i < depth else [], reward=None if i < depth else 1.0)
                 for i in range(depth + 1)]
        return {**hand_trace(1), "trees": [{"task_id": "deep", "nodes": nodes, "paths": {}}]}

    run = make_run(tmp_path / "run", traces=())
    write_trace(run, 1, chain(trace_schema.MAX_TREE_DEPTH))
    start = time.perf_counter()
    r, out = view(run, "--text", "--tree", "0")
    assert r.exit_code == 0 and f"[{trace_schema.MAX_TREE_DEPTH}] answer" not in out, out
    assert f"└─ [{trace_schema.MAX_TREE_DEPTH}] search(x{trace_schema.MAX_TREE_DEPTH})" in out
    assert out.count("└─ ") == trace_schema.MAX_TREE_DEPTH and time.perf_counter() - start < 10
    write_trace(run, 2, chain(trace_schema.MAX_TREE_DEPTH + 1))
    r, out = view(run, "--text", "--step", "2", "--tree", "0")
    assert r.exit_code == 2 and f"at most {trace_schema.MAX_TREE_DEPTH}" in out, out


def test_symbolic_links_and_special_files_are_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "summary.json").write_text(json.dumps({"method": SECRET}))
    (outside / "metrics.jsonl").write_text(json.dumps({"step": 1, SECRET: 1.0}) + "\n")
    make_run(outside / "run", traces=(1,))
    (outside / "run" / "traces" / "step-000001.json").write_text(
        json.dumps(hand_trace(1)).replace("who?", SECRET))
    run = make_run(tmp_path / "run", traces=(1,))
    (run / "summary.json").unlink()
    (run / "summary.json").symlink_to(outside / "summary.json")
    (run / "traces" / "step-000009.json").symlink_to(outside / "run" / "traces" / "step-000001.json")
    r, out = view(run)
    assert r.exit_code == 0, out
    html = (run / "report.html").read_text()
    got = problems(page_data(run / "report.html"))
    assert SECRET not in html
    assert "symbolic link" in got["summary.json"] and "symbolic link" in got["traces/step-000009.json"]
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").symlink_to(outside / "metrics.jsonl")
    os.rename(run / "traces", run / "traces-real")
    (run / "traces").symlink_to(outside / "run" / "traces")
    r, out = view(run)
    html = (run / "report.html").read_text()
    got = problems(page_data(run / "report.html"))
    assert r.exit_code == 0 and SECRET not in html
    assert "symbolic link" in got["metrics.jsonl"] and "symbolic link" in got["traces"]
    (run / "metrics.jsonl").unlink()
    os.mkfifo(run / "metrics.jsonl")              # reading it would wait for a writer forever
    r, out = view(run)
    got = problems(page_data(run / "report.html"))
    assert r.exit_code == 0 and "not a regular file" in got["metrics.jsonl"]
    r, out = view(run, "--text")
    assert r.exit_code == 2 and SECRET not in out


def test_a_sweep_cell_outside_the_sweep_is_refused(tmp_path):
    outside = tmp_path / "outside"
    (outside / "seed-0").mkdir(parents=True)
    (outside / "seed-0" / "summary.json").write_text(json.dumps({"method": SECRET}))
    (outside / "seed-0" / "metrics.jsonl").write_text(json.dumps({"step": 1, SECRET: 1}) + "\n")
    sweep = make_sweep(tmp_path / "sweep", [{"name": str(outside)}, {"name": "../../outside"},
                                            {"name": "a"}], names=("a",))
    (sweep / "cells" / "linked").symlink_to(outside)
    (sweep / "cells" / "a" / "seed-1").symlink_to(outside / "seed-0")
    r, out = view(sweep)
    assert r.exit_code == 0, out
    html = (sweep / "report.html").read_text()
    data = page_data(sweep / "report.html")
    got = problems(data)
    assert SECRET not in html
    assert str(outside) in got["ablation.json"] and "../../outside" in got["ablation.json"]
    assert "symbolic link" in got["cells/linked"] and "symbolic link" in got["cells/a/seed-1"]
    assert [c["name"] for c in data["cells"]] == ["a"] and len(data["cells"][0]["runs"]) == 1


def metrics_file(path: Path, mb: float) -> int:
    """A metrics.jsonl of about `mb` MB of FOCUS-sized rows (about 1.6 KB), a held-out check
    every 10 steps; returns the last step."""
    keys = {f"focus/stat_{k:02d}": 0.123456789 for k in range(60)}
    row = json.dumps({"step": 0, **keys})
    n = int(mb * 2**20 / (len(row) + 1))
    with path.open("w") as f:
        for s in range(1, n + 1):
            extra = f', "eval/success": {s / n:.4f}' if s % 10 == 0 else ""
            f.write(row.replace('"step": 0', f'"step": {s}', 1)[:-1] + extra + "}\n")
    return n


@pytest.mark.parametrize("mb", [3, 24])       # read whole (under 8 MB), read in windows
def test_the_row_cap_holds_on_any_metrics_size(tmp_path, mb):
    run = make_run(tmp_path / "run", traces=())
    last = metrics_file(run / "metrics.jsonl", mb)
    start = time.perf_counter()
    r, out = view(run)
    took = time.perf_counter() - start
    assert r.exit_code == 0, out
    data = page_data(run / "report.html")
    rows = data["metrics"]
    steps = [x["step"] for x in rows]
    evals = [x for x in rows if "eval/success" in x]
    assert data["problems"] == []
    assert 0.9 * view_mod.MAX_ROWS <= len(rows) <= view_mod.MAX_ROWS
    assert steps == sorted(steps) and steps[0] <= last / 100 and steps[-1] >= last - 20
    assert len(evals) >= 0.3 * view_mod.MAX_ROWS and evals[-1]["step"] >= last - 30
    size = (run / "report.html").stat().st_size
    assert size < 1.5e6, size                                    # about 450 rows of 1.6 KB
    assert took < 15, took


def test_a_metrics_file_reads_at_most_its_scan_bytes(tmp_path, monkeypatch):
    """Whatever the file's size, the bytes read are bounded (about SCAN_BYTES)."""
    run = make_run(tmp_path / "run", traces=())
    metrics_file(run / "metrics.jsonl", 20)
    read = []
    real = metric_rows.open_regular

    def counting(path):
        f = real(path)
        raw_read = f.read

        def read_some(n=-1):
            data = raw_read(n)
            read.append(len(data))
            return data

        f.read = read_some
        return f

    monkeypatch.setattr(metric_rows, "open_regular", counting)
    monkeypatch.setattr(metric_rows, "SCAN_BYTES", 2 << 20)
    r, out = view(run)
    assert r.exit_code == 0, out
    assert 0 < sum(read) <= 2 << 20 and len(page_data(run / "report.html")["metrics"]) > 100


def test_control_characters_never_reach_the_page(tmp_path):
    run = make_run(tmp_path / "run")
    cfg = json.loads((run / "config.json").read_text())
    cfg["method"] = "fo\u0000cus\u001b[31m\u0007"
    cfg["env"]["name"] = "se\u0085arch\ud800"
    (run / "config.json").write_text(json.dumps(cfg))
    trace = hand_trace(1)
    trace["episodes"][0]["question"] = "a\u0000b\u001bc\u007fd \\u0000 e\nf\tg"
    write_trace(run, 1, trace)
    r, out = view(run)
    assert r.exit_code == 0, out
    html = (run / "report.html").read_text(encoding="utf-8")
    title = html.split("<title>")[1].split("</title>")[0]
    assert title == "run · focus[31m on search"
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", html)
    assert not re.search(r"(?<!\\)(\\\\)*\\u00[01][0-9a-f]", html.split('id="data">')[1])
    data = page_data(run / "report.html")
    assert data["traces"][0]["episodes"][0]["question"] == "abcd \\u0000 e\nf\tg"
    r, out = view(run, "--text", "--episode", "0")
    assert r.exit_code == 0 and "\x00" not in out and "\x1b" not in out


def test_a_full_disk_leaves_no_temp_file_and_says_so_in_one_line(tmp_path, monkeypatch):
    run = make_run(tmp_path / "run")
    (run / "report.html").write_text("the old report")
    real = os.write

    def full(fd, data):
        if fd <= 2:
            return real(fd, data)
        real(fd, bytes(data[:100]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(view_mod.os, "write", full)
    r, out = view(run)
    monkeypatch.undo()
    assert r.exit_code == 2, out
    lines = [x for x in out.splitlines() if x.strip()]
    assert len(lines) == 1 and "No space left on device" in lines[0] and "Traceback" not in out
    assert sorted(p.name for p in run.iterdir() if p.name.endswith(".tmp")) == []
    assert (run / "report.html").read_text() == "the old report"
    r, out = view(run, "--out", str(tmp_path / "new" / "r.html"))
    assert r.exit_code == 0 and (tmp_path / "new" / "r.html").stat().st_mode & 0o777 == 0o644


def _legend(out: str) -> tuple[str, list[str]]:
    """(the view, the symbols its legend explains)."""
    assert "\n\nlegend:\n" in out, out
    body, legend = out.split("\n\nlegend:\n")
    return body, [re.split(r"\s{2,}", line.strip())[0] for line in legend.splitlines()]


def test_view_text_prints_a_legend_naming_every_symbol_it_uses(tmp_path):
    run = make_run(tmp_path / "run")
    r, out = view(run, "--text", "--tree", "0")
    assert r.exit_code == 0, out
    body, symbols = _legend(out)
    first = {s.split()[0] for s in symbols}
    for line in body.splitlines()[3:]:
        if "  ·  " not in line:
            continue
        for field in line.split("  ·  ", 1)[1].split("  "):        # "v 0.50", "leaf R 1.00", ...
            assert field.split()[0] in first, (field, symbols)
    for used, sym in (("→", "→"), ("×2 [", "×k [i, j]"), ("[0] root", "[i]"), ("Ṽ 0.60", "Ṽ"),
                      ("Ḡ 0.70", "Ḡ"), ("c̄ 0.50", "c̄"), ("launched 1 (#1)", "launched k (#r)"),
                      ("budget by depth", "budget by depth")):
        assert used in body and sym in symbols, (used, sym)
    assert "the critic's value" in out and "refined value" in out and "own samples" in out
    r, out = view(run, "--text")
    body, symbols = _legend(out)
    assert "--tree 0" in body and "--episode 0" in body and {"--tree K", "--episode K"} <= set(symbols)
    r, out = view(run, "--text", "--episode", "0")
    body, symbols = _legend(out)
    assert "turn 1 (not trained)" in body and "trained, adv +0.250" in body
    assert {"turn i", "trained, adv", "reward", "trained tokens", "–"} <= set(symbols)
