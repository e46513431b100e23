"""ablate: the sweep plan, presets, matched budget, a resumable sweep end to end on the micro
model, and the parallel scheduler."""
from __future__ import annotations

import ast
import csv
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl_cli.ablate import aggregate as AG, budget as ABU, plan as AP, reads as ARD, run as AR
from agentrl_cli import config
from agentrl_cli.errors import ConfigError
from agentrl_cli.cli.main import app

from conftest import MICRO

runner = CliRunner()
FAST = MICRO + ["train.eval_every=0", "train.steps=1"]


def _sets(extra=()):
    out = []
    for s in [*FAST, *extra]:
        out += ["--set", s]
    return out


def test_plan_is_the_product_of_methods_and_axes():
    axes = [AP.Axis.key("algo.beta", ["0", "0.5"]), AP.Axis.key("algo.lam", ["0.6", "0.8"])]
    cells = AP.plan(["mpo", "ppo"], axes)
    assert [c.name for c in cells[:4]] == ["mpo_beta=0_lam=0.6", "mpo_beta=0_lam=0.8",
                                           "mpo_beta=0.5_lam=0.6", "mpo_beta=0.5_lam=0.8"]
    assert len(cells) == 8 and cells[-1].method == "ppo"
    assert cells[1].sets == ("algo.beta=0", "algo.lam=0.8")
    assert cells[1].params == {"algo.beta": "0", "algo.lam": "0.8"}
    # two keys ending the same way keep their full names
    same = AP.plan(["ppo"], [AP.Axis.key("algo.lam", ["1"]), AP.Axis.key("other.lam", ["2"])])
    assert same[0].name == "ppo_algo.lam=1_other.lam=2"
    with pytest.raises(ConfigError):
        AP.plan(["grpo"], [AP.Axis.key("algo.beta", ["1", "1"])])


def test_presets_set_the_papers_ablations():
    base = config.load(sets=["rollout.group_size=6"])
    ref = AP.PRESETS.get("refinement")
    (axis,) = ref.axes(base)
    cells = AP.plan(list(ref.methods), [axis])
    off = config.load(sets=list(cells[1].sets), method="focus")
    on = config.load(sets=list(cells[0].sets), method="focus")
    assert cells[1].name == "focus_refinement=off"
    assert (off.algo.focus_max_inflight, off.algo.focus_roots) == (0, 6)
    assert on.algo.focus_max_inflight == 2
    tr = AP.plan(["mpo"], AP.PRESETS.get("turn-ratio").axes(base))
    assert [config.load(sets=list(c.sets), method="mpo").algo.loss for c in tr] == ["turn_ratio", "ppo_clip"]
    tk = AP.plan(["trace"], AP.PRESETS.get("trace-k").axes(base))
    k3, k0 = (config.load(sets=list(c.sets), method="trace").algo for c in tk)
    assert (k3.trace_k, k3.alpha_turn) == (3, 0.2) and k0.alpha_turn == 0.0
    ws = AP.plan(["focus"], AP.PRESETS.get("workspace").axes(base))
    assert [config.load(sets=list(c.sets), method="focus").context.operator for c in ws] == [
        "compaction", "workspace"]
    st = AP.plan(["focus"], AP.PRESETS.get("compaction-style").axes(base))
    assert [(x.operator, x.style) for x in (config.load(sets=list(c.sets), method="focus").context
                                             for c in st)] == [("compaction", "free"),
                                                               ("compaction", "structured")]
    r = runner.invoke(app, ["ablate", "--preset", "nope"])
    assert r.exit_code == 2 and "refinement" in r.output


def test_the_allocation_preset_runs_its_arms_at_one_budget(tmp_path, monkeypatch):
    pre = AP.PRESETS.get("allocation")
    cells = AP.plan(list(pre.methods), pre.axes(config.load()), pre.arms)
    assert [c.name for c in cells] == ["grpo", "focus", "focus-oracle", "focus-kappa0",
                                       "focus-entropy", "focus-contrast", "tree_grpo"]
    algo = {c.name: config.load(sets=list(c.sets), method=c.method).algo for c in cells}
    assert algo["focus-oracle"].focus_critic == "oracle" and algo["focus"].focus_critic == "learned"
    assert algo["focus-kappa0"].kappa == 0 and algo["focus"].kappa == 1
    assert algo["focus-entropy"].focus_allocator == "entropy"
    assert algo["focus-contrast"].focus_norm == "contrast" and algo["focus"].focus_norm == "none"
    assert algo["tree_grpo"].estimator == "tree_grpo" and algo["grpo"].estimator == "grpo"
    calls = []
    monkeypatch.setattr(AR, "_train_here", _fake_run(calls))
    out = tmp_path / "alloc"
    r = runner.invoke(app, ["ablate", "--preset", "allocation", "--benchmark", "allocation-early",
                            "--seeds", "2", "--budget", "10", "--out", str(out),
                            *_sets(["env.max_turns=10"])])
    assert r.exit_code == 0, r.output
    assert sorted({c for c, _ in calls}) == sorted(c.name for c in cells) and len(calls) == 2 * len(cells)
    rec = json.loads((out / "ablation.json").read_text())
    assert rec["preset"] == "allocation" and rec["budget_tokens"] == 10
    # --arms runs only the named arms, in the preset's order
    calls.clear()
    r = runner.invoke(app, ["ablate", "--preset", "allocation", "--benchmark", "allocation-early",
                            "--arms", "focus-oracle,grpo", "--seeds", "1", "--budget", "10",
                            "--out", str(tmp_path / "two"), *_sets(["env.max_turns=10"])])
    assert r.exit_code == 0, r.output
    assert sorted(c for c, _ in calls) == ["focus-oracle", "grpo"]
    r = runner.invoke(app, ["ablate", "--preset", "allocation", "--arms", "grpo,nope",
                            "--out", str(tmp_path / "bad")])
    assert r.exit_code == 2 and "nope" in r.output and "focus-entropy" in r.output
    r = runner.invoke(app, ["ablate", "--preset", "refinement", "--arms", "grpo",
                            "--out", str(tmp_path / "bad2")])
    assert r.exit_code == 2 and "--arms" in r.output


def test_measured_budget_is_one_linear_step(micro_policy):
    cfg = config.load(sets=FAST)
    b = ABU.measure_budget(cfg)
    # tasks_per_step x group_size episodes, each at most max_turns x max_new_tokens tokens
    assert 4 <= b <= 2 * 2 * 3 * 8
    assert ABU.measure_budget(cfg) == b  # deterministic


@pytest.fixture(scope="module")
def sweep_out(tmp_path_factory, micro_policy):
    out = tmp_path_factory.mktemp("abl") / "sweep"
    r = runner.invoke(app, ["ablate", "--method", "mpo", "--beta", "0,1", "--seeds", "2",
                            "--out", str(out), *_sets()])
    assert r.exit_code == 0, r.output
    return out, r.output


def test_sweep_runs_every_cell_and_seed_at_one_budget(sweep_out):
    out, output = sweep_out
    rec = json.loads((out / "ablation.json").read_text())
    budget = rec["budget_tokens"]
    assert budget > 0 and rec["seeds"] == [0, 1]
    runs = sorted(out.glob("cells/*/seed-*"))
    assert [f"{p.parent.name}/{p.name}" for p in runs] == [
        "mpo_beta=0/seed-0", "mpo_beta=0/seed-1", "mpo_beta=1/seed-0", "mpo_beta=1/seed-1"]
    for p in runs:
        cfg = json.loads((p / "config.json").read_text())
        assert cfg["method"] == "mpo" and cfg["rollout"]["budget_tokens"] == budget
        assert cfg["algo"]["beta"] == float(p.parent.name.split("=")[1])
        assert cfg["seed"] == int(p.name.split("-")[1]) and cfg["train"]["steps"] == 1
    with (out / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["cell"] for r in rows] == ["mpo_beta=0", "mpo_beta=1"] and rows[0]["algo.beta"] == "0"
    summary = json.loads((out / "summary.json").read_text())
    for c in summary["cells"]:
        finals = [json.loads((out / "cells" / c["name"] / f"seed-{s}" / "summary.json").read_text())
                  for s in (0, 1)]
        assert c["final_success"] == [f["final_success"] for f in finals]
        assert c["tokens_mean"] == pytest.approx(sum(f["tokens_generated"] for f in finals) / 2)
    assert (out / "learning_curves.png").stat().st_size > 1000
    assert (out / "final_vs_param.png").stat().st_size > 1000
    assert "mpo_beta=0" in output and "held-out success" in output


def test_rerun_skips_finished_runs_and_resumes_partial_ones(sweep_out, monkeypatch):
    import agentrl_cli.train.loop as loop

    out, _ = sweep_out
    calls = []
    real = loop.train

    def spy(cfg, o, resume=None, **kw):
        calls.append((str(o), resume))
        return real(cfg, o, resume=resume, **kw)

    monkeypatch.setattr(loop, "train", spy)
    r = runner.invoke(app, ["ablate", "--method", "mpo", "--beta", "0,1", "--seeds", "2",
                            "--out", str(out), *_sets()])
    assert r.exit_code == 0 and "skipping 4 finished" in r.output and calls == []
    # a run that stopped after its last checkpoint but before its summary resumes from it
    part = out / "cells" / "mpo_beta=1" / "seed-0"
    (part / "summary.json").unlink()
    r = runner.invoke(app, ["ablate", "--method", "mpo", "--beta", "0,1", "--seeds", "2",
                            "--out", str(out), *_sets()])
    assert r.exit_code == 0, r.output
    assert calls == [(str(part), str(part))] and (part / "summary.json").is_file()
    r = runner.invoke(app, ["ablate", "--method", "mpo", "--beta", "0,1", "--seeds", "2",
                            "--out", str(out), "--budget", "7", *_sets()])
    assert r.exit_code == 2 and "finished at budget" in r.output


def test_subprocess_command_makes_the_same_run(sweep_out, tmp_path):
    """What a parallel sweep launches (`agentrl train ...`) configures the run exactly as the
    in-process path did."""
    out, _ = sweep_out
    rec = json.loads((out / "ablation.json").read_text())
    cell = AP.Cell(**{**rec["cells"][0], "sets": tuple(rec["cells"][0]["sets"])})
    sweep = AP.Sweep(tmp_path, [cell], [0], None, rec["sets"], rec["budget_tokens"])
    cmd = AR.train_command(sweep, cell, 0)
    assert cmd[:3] == [sys.executable, "-m", "agentrl_cli.cli.main"]
    r = runner.invoke(app, cmd[3:])
    assert r.exit_code == 0, r.output
    a = json.loads((out / "cells" / cell.name / "seed-0" / "config.json").read_text())
    b = json.loads((sweep.run_dir(cell, 0) / "config.json").read_text())
    a.pop("out"), b.pop("out")
    assert a == b


def test_parallel_scheduler_runs_jobs_at_once_and_reports_failures(tmp_path, monkeypatch):
    script = (
        "import json, os, sys, time, pathlib\n"
        "d = pathlib.Path(sys.argv[1]); d.mkdir(parents=True, exist_ok=True)\n"
        "(d / 'started').write_text(str(time.time())); time.sleep(0.5)\n"
        "(d / 'ended').write_text(str(time.time()))\n"
        "if 'bad' in str(d): print('boom'); sys.exit(3)\n"
        "(d / 'summary.json').write_text(json.dumps({'final_success': 0.5, 'tokens_generated': 10,"
        " 'final_tokens_per_question': 3.0, 'base_success': 0.1}))\n")
    monkeypatch.setattr(AR, "train_command",
                        lambda sw, c, s: [sys.executable, "-c", script, str(sw.run_dir(c, s))])
    cells = [AP.Cell("good1", "grpo"), AP.Cell("good2", "grpo"), AP.Cell("bad", "grpo")]
    sweep = AP.Sweep(tmp_path, cells, [0], None, list(FAST), 50)
    res = AR.run_sweep(sweep, jobs=2, log=lambda s: None)
    assert sorted(res["ran"]) == [("good1", 0), ("good2", 0)]
    assert res["failed"] == [("bad", 0, "boom")]
    t = {c.name: (float((tmp_path / "cells" / c.name / "seed-0" / "started").read_text()),
                  float((tmp_path / "cells" / c.name / "seed-0" / "ended").read_text())) for c in cells}
    assert t["good1"][0] < t["good2"][1] and t["good2"][0] < t["good1"][1]  # the first two overlapped
    assert t["bad"][0] >= min(t["good1"][1], t["good2"][1])                   # never 3 at once
    summary = AG.collect(sweep)
    assert [c["final_success_mean"] for c in summary["cells"]] == [0.5, 0.5, None]


def test_bad_sweeps_fail_before_running(tmp_path):
    for args, needle in ((["--grid", "algo.betta=1,2"], "did you mean"),
                         (["--grid", "algo.beta"], "--grid expects key=v1,v2"),
                         (["--beta", "0,1", "--grid", "algo.beta=2"], "swept twice"),
                         (["--beta", "x"], "algo.beta expects")):
        r = runner.invoke(app, ["ablate", "--out", str(tmp_path / "x"), "--budget", "10", *args])
        assert r.exit_code == 2 and needle in r.output, (args, r.output)
        assert not list((tmp_path / "x").glob("cells/*"))


def test_a_failed_run_is_reported_and_the_others_still_summarised(tmp_path, monkeypatch):
    def fake(sweep, cell, seed, log=None, probe=None):
        if cell.name.endswith("=1"):
            raise RuntimeError("env exploded")
        run = sweep.run_dir(cell, seed)
        run.mkdir(parents=True)
        s = {"final_success": 0.25, "tokens_generated": 100, "final_tokens_per_question": 5.0,
             "base_success": 0.1, "wall_seconds": 1.0}
        (run / "summary.json").write_text(json.dumps(s))
        return s

    monkeypatch.setattr(AR, "_train_here", fake)
    r = runner.invoke(app, ["ablate", "--method", "grpo", "--grid", "algo.kl_coef=0,1",
                            "--out", str(tmp_path), "--budget", "10", *_sets()])
    assert r.exit_code == 1
    assert "failed" in r.output and "env exploded" in r.output and "0.250" in r.output
    rows = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert [(x["cell"], x["final_success_mean"]) for x in rows] == [("grpo_kl_coef=0", "0.25"),
                                                                    ("grpo_kl_coef=1", "")]


# ------------------------------------------------------------------ sweeps that cannot waste time


def _fake_run(calls=None, interrupt_at=None):
    def fake(sweep, cell, seed, log=lambda s: None, probe=None):
        if calls is not None:
            calls.append((cell.name, seed))
        if interrupt_at is not None and len(calls) == interrupt_at:
            raise KeyboardInterrupt
        run = sweep.run_dir(cell, seed)
        run.mkdir(parents=True, exist_ok=True)
        s = {"final_success": 0.25, "tokens_generated": 100, "final_tokens_per_question": 5.0,
             "base_success": 0.1, "wall_seconds": 1.0}
        (run / "summary.json").write_text(json.dumps(s))
        return s
    return fake


def test_method_reads_is_derived_from_the_recipes_parts():
    assert ARD.readers("algo.beta") == ["mpo"]
    # tree_grpo grows its trees with the FOCUS controller, whose planner reads kappa (its random
    # allocator then ignores the gains), so the declaration is the controller's
    assert ARD.readers("algo.kappa") == ["focus", "tree_grpo"]
    assert "algo.kappa" not in ARD.method_reads("grpo")
    assert sorted(ARD.readers("algo.lam")) == ["mpo", "ppo"]
    assert "algo.vine_k" in ARD.method_reads("vineppo") and "algo.vine_k" not in ARD.method_reads("grpo")
    # swapping a part changes what is read: grpo with the vine controller reads vine_k
    assert "algo.vine_k" in ARD.method_reads("grpo", {"algo.controller": "vine"})
    # transitively: trace's preparer reads the teacher-forced answer template
    assert "algo.trace_answer" in ARD.method_reads("trace")
    assert "train.critic_warmup" in ARD.method_reads("ppo") and "train.critic_warmup" not in ARD.method_reads("grpo")


def test_sweeping_a_key_the_method_ignores_is_one_line_and_fast(tmp_path):
    """Before any model loads or run starts: one line naming the methods that read the key. (The
    parts' registries are imported to read what they declare: torch, not transformers.)"""
    code = ("import sys, time; t = time.time()\n"
            "from typer.testing import CliRunner\n"
            "from agentrl_cli.cli.main import app\n"
            "r = CliRunner().invoke(app, ['ablate', '--method', 'focus', '--beta', '0,1'])\n"
            "print(r.exit_code, 'transformers' in sys.modules, round(time.time() - t, 2))\n"
            "print(r.output)\n")
    import subprocess
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    head, msg = p.stdout.split("\n", 1)
    code_, heavy, secs = head.split()
    assert code_ == "2" and heavy == "False", p.stdout + p.stderr
    assert float(secs) < 30
    assert "mpo" in msg and "algo.beta" in msg and len(msg.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_bare_beta_runs_mpo_and_says_so_first(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(AR, "_train_here", _fake_run(calls))
    r = runner.invoke(app, ["ablate", "--beta", "0,1", "--out", str(tmp_path), "--budget", "10",
                            *_sets()])
    assert r.exit_code == 0, r.output
    assert "mpo" in r.output.strip().splitlines()[0]
    assert [c for c, _ in calls] == ["mpo_beta=0", "mpo_beta=1"]
    r = runner.invoke(app, ["ablate", "--lam", "0.5,1", "--out", str(tmp_path / "l"), "--budget", "10"])
    assert r.exit_code == 2 and "mpo, ppo" in r.output


def test_a_typo_in_a_swept_value_fails_before_the_budget_is_measured(tmp_path, monkeypatch):
    def no(cfg):
        raise AssertionError("measured the budget")
    monkeypatch.setattr(ABU, "measure_budget", no)
    r = runner.invoke(app, ["ablate", "--kappa", "1,x", "--out", str(tmp_path), *_sets()])
    assert r.exit_code == 2 and "algo.kappa expects" in r.output, r.output
    r = runner.invoke(app, ["ablate", "--method", "mpo", "--grid", "algo.lam_intra=0.9,zero",
                            "--out", str(tmp_path), *_sets()])
    assert r.exit_code == 2 and "algo.lam_intra expects" in r.output, r.output


def test_plan_warmup_warning_and_progress(tmp_path, monkeypatch):
    monkeypatch.setattr(AR, "_train_here", _fake_run([]))
    r = runner.invoke(app, ["ablate", "--method", "mpo", "--beta", "0,1", "--steps", "2",
                            "--out", str(tmp_path), "--budget", "10", "--seeds", "2"])
    assert r.exit_code == 0, r.output
    assert "warning" in r.output and "critic warm-up" in r.output and "--steps 20" in r.output
    assert "2 cells x 2 seed(s) = 4 runs of 2 steps" in r.output
    assert "cells: mpo_beta=0, mpo_beta=1" in r.output and "time:" in r.output
    lines = []
    p = AR.StepLines("mpo_beta=0 seed 0", lines.append)
    p.start(3, 0)
    p.update(1, {"reward/mean": 0.5, "rollout/tokens": 120, "time/step": 1.0,
                 "eval/success": 0.2, "eval/success_se": 0.05})
    assert lines and "step 1/3" in lines[0] and "held-out 0.20±0.05" in lines[0] and "ETA" in lines[0]


def _cfg(steps: int, eval_every: int):
    from agentrl_cli.config import load

    return load(method="grpo", sets=[f"train.steps={steps}", f"train.eval_every={eval_every}"])


def test_sweep_estimate_is_measured_on_the_first_runs_first_steps():
    """setup once per run, each held-out check at the step's rollout scaled by its episodes,
    the mean step (the first, warm-up step dropped) times the steps, runs over the job slots."""
    cfg = _cfg(20, 10)
    scale = cfg.train.eval_tasks * cfg.train.eval_samples / (
        cfg.rollout.tasks_per_step * cfg.rollout.group_size)
    est = AP.SweepEstimate(setup_s=10.0, step_s=(5.0, 2.0, 2.0), rollout_s=(3.0, 1.0, 1.0))
    assert est.run_seconds(cfg) == pytest.approx(10 + 2 * scale + 2 * 20)   # checks at 10, 20
    assert est.run_seconds(_cfg(25, 10)) == pytest.approx(10 + 3 * scale + 2 * 25)  # and the last
    assert AP.SweepEstimate(10.0, (2.0,)).run_seconds(cfg) == pytest.approx(10 + 2 * 10 + 2 * 20)
    minutes = (10 + 2 * scale + 40) * 4 / 2 / 60
    assert f"about {minutes:.1f} min for 4 run(s)" in est.line([cfg], runs=4, jobs=2)
    lines = []
    probe = AR.EstimateProbe([_cfg(20, 10)], runs=4, jobs=2, log=lines.append)
    steps = AR.StepLines("c seed 0", lambda s: None, probe)
    steps.start(20, 0)
    steps.created = steps.t0 - 10.0                  # 10 s from the run's start to its first step
    row = {"reward/mean": 0.5, "rollout/tokens": 120}
    for i, (t, r) in enumerate(((5.0, 3.0), (2.0, 1.0)), 1):
        steps.update(i, {**row, "time/step": t, "time/rollout": r})
    assert lines == []                               # not before the third step
    for i in (3, 4):
        steps.update(i, {**row, "time/step": 2.0, "time/rollout": 1.0})
    assert len(lines) == 1 and est.line([cfg], 4, 2) == lines[0], lines


def test_a_parallel_sweep_estimates_from_its_first_runs_metrics(tmp_path):
    lines = []
    probe = AR.EstimateProbe([_cfg(20, 10)], runs=2, jobs=2, log=lines.append)
    metrics = tmp_path / "metrics.jsonl"
    probe.watch(metrics, started=0.0)                # no file yet: nothing
    metrics.write_text("".join(json.dumps({"step": i, "time/step": 2.0}) + "\n" for i in (1, 2)))
    probe.watch(metrics, started=0.0)
    assert lines == []
    with metrics.open("a") as f:
        f.write(json.dumps({"step": 3, "time/step": 2.0}) + "\n")
    probe.watch(metrics, started=__import__("time").time() - 16.0)   # 10 s setup + 3 steps
    assert len(lines) == 1 and "2 run(s)" in lines[0] and "2.0s per step" in lines[0]
    assert "10s to its first step" in lines[0] or "11s to its first step" in lines[0]


def test_ctrl_c_prints_a_resume_command_that_resumes(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(AR, "_train_here", _fake_run(calls, interrupt_at=2))
    out = tmp_path / "sw"
    r = runner.invoke(app, ["ablate", "--method", "mpo", "--beta", "0,1", "--out", str(out),
                            "--budget", "10", *_sets()])
    assert r.exit_code == 130
    hint = r.output.strip().splitlines()[-1]
    assert "--resume" not in hint and "Resume with: agentrl ablate" in hint
    import shlex
    args = shlex.split(hint.split("Resume with: ", 1)[1])[1:]
    calls.clear()
    monkeypatch.setattr(AR, "_train_here", _fake_run(calls))
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "skipping 1 finished" in r.output and calls == [("mpo_beta=1", 0)]


def test_benchmark_option_gives_every_run_its_settings(tmp_path, monkeypatch):
    seen = []

    def fake(sweep, cell, seed, log=lambda s: None, probe=None):
        seen.append(sweep.cell_config(cell, seed))
        return _fake_run()(sweep, cell, seed, log)

    monkeypatch.setattr(AR, "_train_here", fake)
    r = runner.invoke(app, ["ablate", "--benchmark", "search-long", "--method", "grpo,focus",
                            "--out", str(tmp_path / "sw"), "--budget", "10",
                            *_sets(["env.max_turns=20"])])
    assert r.exit_code == 0, r.output
    assert len(seen) == 2
    for cfg in seen:
        # the benchmark's presets, with the user's --set winning where both set a key
        assert (cfg.env.name, cfg.env.min_hops, cfg.env.max_hops) == ("search", 4, 5)
        assert cfg.rollout.max_tokens == 1024 and cfg.env.max_turns == 20
    r = runner.invoke(app, ["ablate", "--benchmark", "nope", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "nope" in r.output


# ------------------------------------------------------------------ declared reads vs the source
def _registration(call) -> bool:
    """`REG.register("name", Obj(step, ...), ...)`: a registration by a call."""
    return (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr == "register" and isinstance(call.func.value, ast.Name)
            and len(call.args) == 2 and isinstance(call.args[0], ast.Constant)
            and isinstance(call.args[1], ast.Call) and call.args[1].args
            and isinstance(call.args[1].args[0], ast.Name))


class _Source:
    """The package's source, parsed: which `algo.*` keys a registered entry reads, itself and
    transitively through the package functions and classes it names (`algo.X`, `ctx.algo.X`,
    `self.algo.X`). The package declares its parts' reads where they register; this reading of
    the source checks the declarations."""

    def __init__(self, root: Path):
        self.defs: dict[tuple[str, str], ast.AST] = {}     # (module, name) -> FunctionDef/ClassDef
        self.names: dict[str, dict[str, tuple]] = {}       # module -> local name -> target
        self.entries: dict[tuple[str, str], list] = {}     # (registry, entry) -> defs
        self.pending: list[tuple[str, str, str, str]] = []  # registrations by a call
        for path in sorted(root.rglob("*.py")):
            mod = ".".join(path.relative_to(root).with_suffix("").parts)
            tree = ast.parse(path.read_text())
            pkg = mod.rsplit(".", 1)[0] if "." in mod else ""
            if path.name == "__init__.py":
                mod = pkg = mod[: -len(".__init__")] if mod.endswith(".__init__") else ""
            local: dict[str, tuple] = {}
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    self.defs[(mod, node.name)] = node
                    local[node.name] = ("def", mod, node.name)
                    for d in node.decorator_list:
                        if (isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)
                                and d.func.attr == "register" and isinstance(d.func.value, ast.Name)
                                and d.args and isinstance(d.args[0], ast.Constant)):
                            self.entries.setdefault((d.func.value.id, d.args[0].value), []).append((mod, node))
                elif isinstance(node, ast.Expr) and _registration(node.value):
                    # `REG.register("name", Controller(step, ...))` in a package's `__init__`:
                    # the entry is the in-process step (the first argument of the object built)
                    call = node.value
                    self.pending.append((call.func.value.id, call.args[0].value, mod,
                                         call.args[1].args[0].id))
                elif isinstance(node, ast.ImportFrom) and node.level:
                    base = pkg.split(".") if pkg else []
                    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                    src = ".".join([*base, *(node.module.split(".") if node.module else [])])
                    for a in node.names:
                        local[a.asname or a.name] = ("from", src, a.name)
            self.names[mod] = local
        for reg, entry, mod, name in self.pending:
            target = self._resolve(mod, name)
            self.entries.setdefault((reg, entry), []).append((target[0], self.defs[target]))

    def _resolve(self, mod: str, name: str, attr: str | None = None):
        t = self.names.get(mod, {}).get(name)
        if t is None:
            return None
        if t[0] == "def":
            return (t[1], t[2]) if attr is None else None
        src, what = t[1], t[2]
        if attr is not None:   # `from . import batched` then `batched.f`
            sub = f"{src}.{what}" if src else what
            return (sub, attr) if (sub, attr) in self.defs else None
        if (src, what) in self.defs:
            return (src, what)
        return self._resolve(src, what) if src in self.names and what in self.names[src] else None

    def reads(self, registry: str, entry: str) -> set[str]:
        keys: set[str] = set()
        todo = list(self.entries.get((registry, entry), []))
        seen: set[tuple[str, str]] = set()
        while todo:
            mod, node = todo.pop()
            if (mod, node.name) in seen:
                continue
            seen.add((mod, node.name))
            for sub in ast.walk(node):
                if isinstance(sub, ast.Attribute):
                    v = sub.value
                    if (isinstance(v, ast.Name) and v.id == "algo") or \
                            (isinstance(v, ast.Attribute) and v.attr == "algo"):
                        keys.add(f"algo.{sub.attr}")
                    if isinstance(v, ast.Name) and isinstance(sub.ctx, ast.Load):
                        target = self._resolve(mod, v.id, sub.attr)
                        if target:
                            todo.append((target[0], self.defs[target]))
                elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                    target = self._resolve(mod, sub.id)
                    if target and target != (mod, node.name):
                        todo.append((target[0], self.defs[target]))
        return keys


def test_declared_reads_match_what_the_source_reads():
    """Every estimator, preparer, controller and loss declares exactly the `algo.*` keys its
    code reads (itself and through what it calls), so `ablate`'s checks are right."""
    from agentrl_cli.credit.estimators import ESTIMATORS
    from agentrl_cli.rollout.controllers import CONTROLLERS
    from agentrl_cli.train.policy_losses import POLICY_LOSSES
    from agentrl_cli.train.prepare import PREPARERS

    src = _Source(Path(__file__).resolve().parents[1] / "agentrl_cli")
    for name, reg in (("ESTIMATORS", ESTIMATORS), ("CONTROLLERS", CONTROLLERS),
                      ("POLICY_LOSSES", POLICY_LOSSES), ("PREPARERS", PREPARERS)):
        for entry in reg.names():
            declared = {k for k in reg.reads(entry) if k.startswith("algo.")}
            assert declared == src.reads(name, entry), (name, entry)


# ------------------------------------------------------------------ reruns, --env, values
def _fake_run_with_config(calls):
    """`_fake_run` that also writes the run's config.json, as a real run does."""
    def fake(sweep, cell, seed, log=lambda s: None, probe=None):
        calls.append((cell.name, seed))
        s = _fake_run()(sweep, cell, seed, log)
        run = sweep.run_dir(cell, seed)
        (run / "config.json").write_text(json.dumps(sweep.cell_config(cell, seed).to_dict()))
        return s
    return fake


def test_a_rerun_with_fewer_methods_keeps_the_earlier_cells_in_the_summary(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(AR, "_train_here", _fake_run_with_config(calls))
    out = tmp_path / "sw"
    r = runner.invoke(app, ["ablate", "--method", "grpo,rloo", "--out", str(out), "--budget", "10",
                            *_sets()])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["ablate", "--method", "grpo", "--out", str(out), "--budget", "10",
                            *_sets()])
    assert r.exit_code == 0, r.output
    assert calls == [("grpo", 0), ("rloo", 0)]           # nothing ran twice
    assert "keeping 1 finished cell(s) of earlier runs of this sweep in the summary: rloo" in r.output
    summary = json.loads((out / "summary.json").read_text())
    assert [c["name"] for c in summary["cells"]] == ["grpo", "rloo"]
    assert [x["cell"] for x in csv.DictReader((out / "summary.csv").open())] == ["grpo", "rloo"]
    rec = json.loads((out / "ablation.json").read_text())
    assert [c["name"] for c in rec["cells"]] == ["grpo", "rloo"]   # a third rerun keeps it too
    # an earlier cell that ran with other settings than this rerun gives is left out, said why
    r = runner.invoke(app, ["ablate", "--method", "grpo", "--out", str(tmp_path / "sw2"),
                            "--budget", "10", *_sets()])
    r = runner.invoke(app, ["ablate", "--method", "rloo", "--out", str(tmp_path / "sw2"),
                            "--budget", "10", *_sets(["train.lr=0.5"])])
    assert r.exit_code == 0, r.output
    assert "not in the summary: grpo" in r.output and "train.lr" in r.output
    summary = json.loads((tmp_path / "sw2" / "summary.json").read_text())
    assert [c["name"] for c in summary["cells"]] == ["rloo"]


def test_env_option_reaches_every_cell_and_is_recorded(tmp_path, monkeypatch):
    seen = []

    def fake(sweep, cell, seed, log=lambda s: None, probe=None):
        seen.append(sweep.cell_config(cell, seed))
        return _fake_run()(sweep, cell, seed, log)

    monkeypatch.setattr(AR, "_train_here", fake)
    out = tmp_path / "sw"
    r = runner.invoke(app, ["ablate", "--env", "locate", "--method", "grpo,rloo", "--out", str(out),
                            "--budget", "10", *_sets()])
    assert r.exit_code == 0, r.output
    assert [c.env.name for c in seen] == ["locate", "locate"]
    assert "env.name=locate" in json.loads((out / "ablation.json").read_text())["sets"]
    r = runner.invoke(app, ["ablate", "--env", "locate", "--benchmark", "search-long",
                            "--out", str(tmp_path / "x"), "--budget", "10"])
    assert r.exit_code == 2 and "give --benchmark or --env, not both" in r.output


@pytest.mark.parametrize("args", [["--beta", "1,,2"], ["--kappa", "1,2,"],
                                  ["--grid", "algo.lam=0.9,,0.95"], ["--method", "grpo,,rloo"]])
def test_an_empty_item_in_a_value_list_is_one_line(args, tmp_path):
    r = runner.invoke(app, ["ablate", "--out", str(tmp_path / "x"), "--budget", "10", *args])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "has an empty item" in lines[0], r.output
    assert not (tmp_path / "x").exists()
