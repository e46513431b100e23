"""`agentrl ablate --tune`: every method of a sweep tuned alike on exploration seeds, each
method's cells run at its own pick, the picks and the tuning runs' numbers recorded, a cut
sweep resumed without rerunning finished tuning runs."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from agentrl_cli.ablate import run as AR
from agentrl_cli.cli.main import app

from conftest import MICRO

runner = CliRunner()
FAST = [*MICRO, "train.eval_every=0", "train.steps=1"]

# The planted grid: a run's held-out checks (steps 1 and 2) by method and values. GRPO is best
# at lr 1e-3 with eps_high 0.28, FOCUS at lr 2e-4 with focus_norm contrast; the seed moves each
# score a little, and on seed 100 alone GRPO's lr 2e-4 / eps_high 0.28 point would win, so only
# the mean over both tuning seeds picks right.
PLANTED = {
    ("grpo", 2e-4, "0.2"): 0.30, ("grpo", 2e-4, "0.28"): 0.52, ("grpo", 1e-3, "0.2"): 0.40,
    ("grpo", 1e-3, "0.28"): 0.55,
    ("focus", 2e-4, "none"): 0.35, ("focus", 2e-4, "contrast"): 0.60,
    ("focus", 1e-3, "none"): 0.20, ("focus", 1e-3, "contrast"): 0.45,
}
SEED_SHIFT = {100: 0.04, 101: -0.04}


def _planted(cfg) -> float:
    third = str(cfg.algo.eps_high) if cfg.method == "grpo" else cfg.algo.focus_norm
    base = PLANTED[(cfg.method, cfg.train.lr, third)]
    if (cfg.method, cfg.train.lr, third) == ("grpo", 2e-4, "0.28"):
        return base + 2 * SEED_SHIFT.get(cfg.seed, 0.0)     # best on seed 100 only
    return base + SEED_SHIFT.get(cfg.seed, 0.0) / 2


def _fake_train(calls, stop_at=None):
    """A test double of one run: its config.json, a metrics.jsonl whose checks are the planted
    score (step 0 at 0.1) and a summary.json, as a real run writes them."""
    def fake(sweep, cell, seed, log=lambda s: None, probe=None):
        cfg = sweep.cell_config(cell, seed)
        calls.append((str(sweep.run_dir(cell, seed).relative_to(sweep.out.parent)), cfg))
        if stop_at is not None and len(calls) == stop_at:
            raise KeyboardInterrupt
        run = sweep.run_dir(cell, seed)
        run.mkdir(parents=True, exist_ok=True)
        (run / "config.json").write_text(json.dumps(cfg.to_dict()))
        score = _planted(cfg)
        rows = [{"step": 0, "eval/success": 0.1}]
        rows += [{"step": s, "eval/success": score, "rollout/tokens": 90, "rollout/tasks": 3,
                  "rollout/mixed_groups": 0.5} for s in (1, 2)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        s = {"final_success": score, "tokens_generated": 180, "final_tokens_per_question": 5.0,
             "base_success": 0.1, "wall_seconds": 1.0}
        (run / "summary.json").write_text(json.dumps(s))
        return s
    return fake


def _args(out, *extra):
    args = ["ablate", "--method", "grpo,focus", "--out", str(out), "--budget", "100",
            "--tune", "train.lr=2e-4,1e-3", "--tune", "focus:algo.focus_norm=none,contrast",
            "--tune", "grpo:algo.eps_high=0.2,0.28", "--tune-seeds", "2", *extra]
    for s in FAST:
        args += ["--set", s]
    return args


def test_a_planted_grid_is_picked_per_method_and_the_verdict_runs_at_the_picks(tmp_path,
                                                                                monkeypatch):
    calls = []
    monkeypatch.setattr(AR, "_train_here", _fake_train(calls))
    out = tmp_path / "sw"
    r = runner.invoke(app, _args(out), env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    rec = json.loads((out / "tuning.json").read_text())
    assert rec["methods"]["grpo"]["pick"]["values"] == {"train.lr": "1e-3", "algo.eps_high": "0.28"}
    assert rec["methods"]["focus"]["pick"]["values"] == {"train.lr": "2e-4",
                                                         "algo.focus_norm": "contrast"}
    assert rec["runs_per_method"] == 8 and rec["seeds"] == [100, 101]
    point = next(p for p in rec["methods"]["focus"]["points"]
                 if p["values"] == {"train.lr": "2e-4", "algo.focus_norm": "contrast"})
    assert point["mean_of_checks"] == {"100": 0.62, "101": 0.58}
    assert abs(point["score"] - 0.60) < 1e-9
    # the same number of tuning runs per method, all on exploration seeds, none on seed 0
    tuning = [(p, c) for p, c in calls if p.startswith("tune/")]
    assert len(tuning) == 16
    assert sum(c.method == "grpo" for _, c in tuning) == sum(c.method == "focus" for _, c in tuning)
    assert {c.seed for _, c in tuning} == {100, 101}
    verdict = {c.method: c for p, c in calls if not p.startswith("tune/")}
    assert {c.seed for c in verdict.values()} == {0}
    assert (verdict["grpo"].train.lr, verdict["grpo"].algo.eps_high) == (1e-3, 0.28)
    assert (verdict["focus"].train.lr, verdict["focus"].algo.focus_norm) == (2e-4, "contrast")
    summary = json.loads((out / "summary.json").read_text())
    tuned = {c["name"]: c["tuned"] for c in summary["cells"]}
    assert tuned == {"grpo": {"train.lr": "1e-3", "algo.eps_high": "0.28"},
                     "focus": {"train.lr": "2e-4", "algo.focus_norm": "contrast"}}
    assert summary["tuning"]["methods"]["focus"]["pick"]["score"] == point["score"]
    assert {c["tasks_per_step_mean"] for c in summary["cells"]} == {3}
    assert "grpo: picked train.lr=1e-3 algo.eps_high=0.28" in r.output
    table = r.output[r.output.index("ablation "):]          # the results table: its picks
    assert "lr=1e-3 eps_high=0.28" in table and "lr=2e-4 focus_norm=contrast" in table
    assert "tuned" in (out / "summary.csv").read_text().splitlines()[0]


def test_a_cut_sweep_reuses_its_finished_tuning_runs(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(AR, "_train_here", _fake_train(calls, stop_at=6))
    out = tmp_path / "sw"
    r = runner.invoke(app, _args(out))
    assert r.exit_code == 130
    assert "--tune train.lr=2e-4,1e-3" in r.output and "--tune-seeds 2" in r.output
    finished = [p for p, _ in calls[:5]]
    again = []
    monkeypatch.setattr(AR, "_train_here", _fake_train(again))
    r = runner.invoke(app, _args(out))
    assert r.exit_code == 0, r.output
    rerun = [p for p, _ in again]
    assert not set(finished) & set(rerun)
    assert len([p for p in rerun if p.startswith("tune/")]) == 16 - 5
    assert json.loads((out / "tuning.json").read_text())["methods"]["grpo"]["pick"]["values"] \
        == {"train.lr": "1e-3", "algo.eps_high": "0.28"}
    again.clear()                                 # a third run: everything is reused
    assert runner.invoke(app, _args(out)).exit_code == 0
    assert again == []


def test_unequal_grids_and_shared_seeds_are_one_line_errors(tmp_path):
    base = ["ablate", "--method", "grpo,focus", "--out", str(tmp_path / "x"), "--budget", "100"]
    for s in FAST:
        base += ["--set", s]
    r = runner.invoke(app, [*base, "--tune", "train.lr=2e-4,1e-3",
                            "--tune", "focus:algo.focus_norm=none,contrast"])
    assert r.exit_code == 2 and "same number of tuning runs" in r.output
    assert "grpo 2, focus 4" in r.output
    r = runner.invoke(app, [*base, "--tune", "train.lr=2e-4,1e-3", "--seed", "100"])
    assert r.exit_code == 2 and "both a verdict seed and a tuning seed" in r.output
    r = runner.invoke(app, [*base, "--tune", "grpo:algo.focus_norm=none,contrast",
                            "--tune", "focus:train.lr=1,2"])
    assert r.exit_code == 2 and "grpo does not read algo.focus_norm" in r.output
    assert not (tmp_path / "x").exists()


def test_tuning_runs_end_to_end_on_the_micro_model(tmp_path):
    """Real runs (1 step each): two points per method, then each method at its pick."""
    out = tmp_path / "sw"
    args = ["ablate", "--method", "grpo,focus", "--out", str(out), "--budget", "120",
            "--tune", "train.lr=1e-4,1e-3"]
    for s in FAST:
        args += ["--set", s]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    rec = json.loads((out / "tuning.json").read_text())
    for m in ("grpo", "focus"):
        points = rec["methods"][m]["points"]
        assert len(points) == 2 and all(p["score"] is not None for p in points)
        pick = rec["methods"][m]["pick"]
        assert pick["score"] == max(p["score"] for p in points)
        run = json.loads((out / "cells" / m / "seed-0" / "config.json").read_text())
        assert run["train"]["lr"] == float(pick["values"]["train.lr"])
        assert (out / "tune" / "cells" / f"{m}_lr=1e-4" / "seed-100" / "summary.json").is_file()


def test_a_failed_tuning_run_leaves_no_pick_and_runs_no_verdict_cell(tmp_path, monkeypatch):
    calls = []
    fake = _fake_train(calls)

    def failing(sweep, cell, seed, log=lambda s: None, probe=None):
        if cell.name == "focus_lr=1e-3_focus_norm=none" and seed == 101:
            calls.append(("failed", None))
            raise RuntimeError("planted failure")
        return fake(sweep, cell, seed, log, probe)

    monkeypatch.setattr(AR, "_train_here", failing)
    out = tmp_path / "sw"
    r = runner.invoke(app, _args(out))
    assert r.exit_code == 1
    assert "planted failure" in r.output
    rec = json.loads((out / "tuning.json").read_text())
    assert rec["methods"]["focus"]["pick"] is None
    assert all(p.startswith("tune/") for p, _ in calls if p != "failed")
    assert not (out / "cells").exists()
