"""The run folder: nothing a user or a crash does corrupts a run.

Fault injection on real `agentrl train` subprocesses (SIGKILL mid-save and at random points
mid-step, resumed each time: metrics and weights equal an uninterrupted run), each kind of
damaged checkpoint file, two concurrent writers, copy-and-resume, and every user mistake as one
line with exit 2 before any work. Kept small for CI: the micro model of conftest, 3 steps.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from agentrl_cli import config
from agentrl_cli.errors import ConfigError
from agentrl_cli.cli.main import app
from agentrl_cli.train import checkpoint, loop, run_folder
from conftest import MICRO
from agentrl_cli.app.train import train as checked_train

runner = CliRunner(env={"COLUMNS": "1000"})   # no wrapped lines in the output
SETS = MICRO + ["train.steps=3", "train.save_every=1", "train.eval_every=2",
                "rollout.max_new_tokens=6"]
VOLATILE = ("time/", "tokens/s")


def _cli_sets(sets=SETS) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def _rows(out: Path) -> list[dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def _assert_same_run(out: Path, ref: Path) -> None:
    """Metrics rows and the final weights equal the uninterrupted run's."""
    assert _rows(out) == _rows(ref)
    a = load_file(str(checkpoint.step_dir(ref, 3) / "model.safetensors"))
    b = load_file(str(checkpoint.step_dir(out, 3) / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _one_line_exit_2(res, needle: str) -> None:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in res.output, res.output


@pytest.fixture(scope="module")
def ref(tmp_path_factory) -> Path:
    """An uninterrupted 3-step run, checkpoint at every step."""
    out = tmp_path_factory.mktemp("ref") / "run"
    checked_train(config.load(method="grpo", sets=SETS), out, log=lambda s: None)
    return out


def _stopped_after(ref: Path, dst: Path, step: int) -> Path:
    """`ref` as a run killed right after its checkpoint at `step`."""
    shutil.copytree(ref, dst)
    for c in checkpoint.steps_newest_first(dst):
        if int(c.name.split("-")[1]) > step:
            shutil.rmtree(c)
    (dst / "summary.json").unlink()
    (dst / "checkpoints" / "latest").write_text(f"step-{step:06d}")
    rows = (dst / "metrics.jsonl").read_text().splitlines()
    (dst / "metrics.jsonl").write_text("".join(r + "\n" for r in rows if json.loads(r)["step"] <= step))
    return dst


def _no_work(monkeypatch):
    """Fail the test if a command loads a model or evaluates (the check came too late)."""
    def boom(*a, **k):
        raise AssertionError("work started before the mistake was reported")
    import agentrl_cli.app.evaluate as ae
    import agentrl_cli.app.rollout as ar
    import agentrl_cli.evaluation.runner as er
    import agentrl_cli.models.loading as ml
    import agentrl_cli.rollout.runner as rr

    monkeypatch.setattr(loop, "open_runtime", boom)
    monkeypatch.setattr(ml, "load_policy", boom)
    for where in (er, ae):                # `agentrl eval` calls it by its own name
        monkeypatch.setattr(where, "run_eval", boom)
    for where in (rr, ar):                # `agentrl rollout` calls them by its own names
        monkeypatch.setattr(where, "run_expert", boom)
        monkeypatch.setattr(where, "run_episodes", boom)


# ------------------------------------------------------------------ subprocess fault injection
KILLER = """
import os, signal, sys
import torch
real = torch.save
def save(obj, f, *a, **k):
    real(obj, f, *a, **k)
    if ".step-%06d." % int(os.environ["KILL_IN_SAVE"]) in str(f):
        os.kill(os.getpid(), signal.SIGKILL)     # state written, manifest and rename not yet
torch.save = save
from agentrl_cli.cli.main import app
sys.argv[0] = "agentrl"
app()
"""


def _agentrl(args, **env) -> subprocess.Popen:
    e = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "KILL_IN_SAVE": "0", **env}
    return subprocess.Popen([sys.executable, "-c", KILLER, *args], env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_sigkill_inside_a_checkpoint_save_then_resume(ref, tmp_path):
    """A kill between writing a checkpoint's files and publishing it: the temp folder is
    removed on resume, the run continues from the checkpoint before, and ends identical."""
    out = tmp_path / "run"
    p = _agentrl(["train", "--method", "grpo", "--out", str(out), *_cli_sets()], KILL_IN_SAVE="2")
    p.communicate(timeout=300)
    assert p.returncode == -signal.SIGKILL
    assert list((out / "checkpoints").glob(".step-000002.*"))      # the half-written save
    res = runner.invoke(app, ["train", "--resume", str(out)])
    assert res.exit_code == 0, res.output
    assert "temp file(s) left by an interrupted run" in res.output
    assert not list((out / "checkpoints").glob(".step-*"))
    _assert_same_run(out, ref)


def test_sigkill_at_random_points_and_a_second_writer(ref, tmp_path):
    """Two kills at seeded random points mid-step (after the k-th metrics row, plus a random
    delay), each resumed; while a run lives, a second writer (fresh or --resume) exits 2 naming
    its pid and writes nothing. The resumed run equals the uninterrupted one."""
    rng = random.Random(18)
    out = tmp_path / "run"
    args = ["train", "--method", "grpo", "--out", str(out), *_cli_sets()]
    for kill in range(2):
        m = out / "metrics.jsonl"
        ino = m.stat().st_ino if kill else None          # a resume rewrites it (new inode)
        p = _agentrl(args if kill == 0 else ["train", "--resume", str(out)])
        # rows a resumed run keeps: up to its newest checkpoint; then 1-2 more (kill 0) or 1
        kept = 1 + max([int(c.name[5:]) for c in checkpoint.steps_newest_first(out)], default=0) \
            if kill else 0
        target, deadline = kept + (rng.randint(1, 2) if kill == 0 else 1), time.time() + 240
        while p.poll() is None and time.time() < deadline:
            try:
                if m.stat().st_ino != ino and len(m.read_text().splitlines()) >= target:
                    break
            except FileNotFoundError:
                pass
            time.sleep(0.01)
        if kill == 0:
            # paused while the second writers try, so the 3-step run cannot finish meanwhile
            # (it holds its lock, stopped or not)
            p.send_signal(signal.SIGSTOP)
        assert p.poll() is None, p.communicate()[0][-2000:]
        if kill == 0:
            before = (out / "metrics.jsonl").read_text()
            for second in (args, ["train", "--resume", str(out)]):
                res = runner.invoke(app, second)
                _one_line_exit_2(res, f"in use by another agentrl process (pid {p.pid})")
            assert (out / "metrics.jsonl").read_text().startswith(before)
            p.send_signal(signal.SIGCONT)
        time.sleep(rng.uniform(0.0, 0.15))
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=60)
        assert p.returncode == -signal.SIGKILL and not (out / "summary.json").exists()
    res = runner.invoke(app, ["train", "--resume", str(out)])
    assert res.exit_code == 0, res.output
    _assert_same_run(out, ref)


def test_a_killed_tiny_build_is_cleaned_on_the_next_start(tmp_path):
    """A kill during the tiny model's build leaves `tiny-*.xxxxxxxx`; the next start removes
    it, but not a build that is still running."""
    import fcntl

    from agentrl_cli.models import tiny
    from agentrl_cli.models.loading import tiny_recipe
    from agentrl_cli.app import tiny_build

    script = (
        "import os, signal\n"
        "from agentrl_cli.models.tiny import TinyRecipe\n"
        "from agentrl_cli.app import tiny_build\n"
        "def build(recipe, out, log, threads=None):\n"
        "    (out / 'config.json').write_text('{')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "tiny_build.build_tiny = build\n"
        "tiny_build.ensure_tiny(TinyRecipe.from_flat({'env_seed': 987}))\n")
    p = subprocess.run([sys.executable, "-c", script], env=dict(os.environ), timeout=120)
    assert p.returncode == -signal.SIGKILL
    root = tiny.cache_root()
    killed = [d for d in root.glob("tiny-*.*") if d.is_dir()]
    assert killed
    live = root / "tiny-search-000000000000.abcd1234"      # a build still running
    live.mkdir()
    fd = os.open(live / tiny_build.BUILD_LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        cfg = config.load(sets=MICRO)
        tiny_build.ensure_tiny(tiny_recipe(cfg), log=lambda s: None)   # any start that needs tiny
        assert not any(d.exists() for d in killed) and live.is_dir()
    finally:
        os.close(fd)
        shutil.rmtree(live)


# ------------------------------------------------------------------------ the run folder
def test_a_fresh_run_refuses_a_folder_that_holds_a_run(ref, tmp_path, monkeypatch):
    out = tmp_path / "run"
    shutil.copytree(ref, out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with monkeypatch.context() as m:
        _no_work(m)
        res = runner.invoke(app, ["train", "--method", "grpo", "--out", str(out), *_cli_sets()])
    _one_line_exit_2(res, "already holds a run: continue it with --resume")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    res = runner.invoke(app, ["train", "--method", "grpo", "--out", str(out), "--overwrite",
                              *_cli_sets(SETS + ["train.steps=1"])])
    assert res.exit_code == 0, res.output
    assert [c.name for c in checkpoint.steps_newest_first(out)] == ["step-000001"]
    assert [r["step"] for r in _rows(out)] == [0, 1]
    assert json.loads((out / "summary.json").read_text())["steps"] == 1


def test_a_copied_run_resumes_where_it_is(ref, tmp_path):
    run = _stopped_after(ref, tmp_path / "run", 2)
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    res = runner.invoke(app, ["train", "--resume", str(copy)])
    assert res.exit_code == 0, res.output
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before   # untouched
    _assert_same_run(copy, ref)
    assert json.loads((copy / "config.json").read_text())["out"] == str(copy)


def test_an_older_builds_run_folder_resumes_and_overwrite_leaves_it(ref, tmp_path, monkeypatch):
    """A run folder without the marker (an older build's): --resume continues it exactly;
    --overwrite refuses it, one line, nothing touched."""
    run = _stopped_after(ref, tmp_path / "run", 2)
    (run / run_folder.MARKER).unlink()
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with monkeypatch.context() as m:
        _no_work(m)
        res = runner.invoke(app, ["train", "--method", "grpo", "--out", str(run), "--overwrite",
                                  *_cli_sets()])
    _one_line_exit_2(res, f"{run} is not an agentrl run folder")
    assert "already holds a run" not in res.output
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    res = runner.invoke(app, ["train", "--resume", str(run)])
    assert res.exit_code == 0, res.output
    assert "older build" in res.output
    _assert_same_run(run, ref)


def _damage(run: Path, kind: str) -> None:
    c = checkpoint.step_dir(run, 3)
    if kind == "weights truncated":
        f = c / "model.safetensors"
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    elif kind == "weights bit flip":
        f = c / "model.safetensors"
        b = bytearray(f.read_bytes())
        b[-5] ^= 0xFF
        f.write_bytes(bytes(b))
    elif kind == "trainer state truncated":
        f = c / checkpoint.STATE_FILE
        f.write_bytes(f.read_bytes()[:100])
    elif kind == "model config emptied":
        (c / "config.json").write_text("")
    elif kind == "tokenizer deleted":
        (c / "tokenizer.json").unlink()
    elif kind == "manifest garbage":
        (c / checkpoint.MANIFEST).write_text("{not json")
    elif kind == "latest empty":
        shutil.rmtree(c)
        (run / "checkpoints" / "latest").write_text("")
    elif kind == "latest dangling":
        shutil.rmtree(c)
        (run / "checkpoints" / "latest").write_text("step-000099")


@pytest.mark.parametrize("kind", ["weights truncated", "weights bit flip",
                                  "trainer state truncated", "model config emptied",
                                  "tokenizer deleted", "manifest garbage", "latest empty",
                                  "latest dangling"])
def test_resume_skips_a_damaged_newest_checkpoint(ref, tmp_path, kind):
    """The damaged checkpoint is named and skipped; the run continues from the one before it
    (its metrics rows past that one dropped) and ends identical to the uninterrupted run."""
    run = tmp_path / "run"
    shutil.copytree(ref, run)
    (run / "summary.json").unlink()
    _damage(run, kind)
    res = runner.invoke(app, ["train", "--resume", str(run)])
    assert res.exit_code == 0, res.output
    if kind.startswith("latest"):
        assert "resumed from" in res.output and "step-000002" in res.output
    else:
        assert "skipping damaged checkpoint" in res.output and "step-000003" in res.output
    _assert_same_run(run, ref)


def test_all_checkpoints_damaged_is_one_line(ref, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(ref, run)
    (run / "summary.json").unlink()           # a stopped run (a finished one is left as it is)
    for c in checkpoint.steps_newest_first(run):
        (c / "model.safetensors").write_bytes(b"")
    res = runner.invoke(app, ["train", "--resume", str(run)])
    _one_line_exit_2(res, "no usable checkpoint")
    assert "step-000001" in res.output and "--overwrite" in res.output


def test_a_torn_last_metrics_line_is_dropped_and_reported(ref, tmp_path):
    run = _stopped_after(ref, tmp_path / "run", 2)
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "reward/me')                 # a write cut short by a kill
    res = runner.invoke(app, ["diagnose", "tool-calls", "--run", str(run), "--window", "1"])
    assert res.exit_code == 0, res.output
    assert "torn last line" in res.output
    res = runner.invoke(app, ["train", "--resume", str(run)])
    assert res.exit_code == 0, res.output
    assert "torn last line" in res.output
    _assert_same_run(run, ref)


def test_resume_refuses_steps_below_the_runs_step(ref, tmp_path, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(ref, run)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with monkeypatch.context() as m:
        _no_work(m)
        res = runner.invoke(app, ["train", "--resume", str(run), "--set", "train.steps=2"])
    _one_line_exit_2(res, "train.steps=2 is below the run's step 3")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


# ------------------------------------------------------------- user mistakes: one line, exit 2
def _bad_inputs(tmp: Path) -> dict[str, Path]:
    bad = tmp / "latin1.yaml"
    bad.write_bytes(b"train:\n  lr: 1e-4  # d\xe9j\xe0 vu\n")
    dup = tmp / "dup.yaml"
    dup.write_text("train:\n  lr: 1.0e-4\n  steps: 3\n  lr: 2.0e-4\n")
    notmodel = tmp / "notmodel"
    notmodel.mkdir()
    (notmodel / "weights.bin").write_bytes(b"x")
    afile = tmp / "afile"
    afile.write_text("x")
    return {"latin1": bad, "dup": dup, "notmodel": notmodel, "afile": afile, "folder": tmp}


MISTAKES = [
    (["train", "--set", "rollout.group_size=1e9"], "rollout.group_size must be <= 1,024"),
    (["train", "--set", "train.steps=1e12"], "train.steps must be <= 10,000,000"),
    (["train", "--set", "rollout.tasks_per_step=60000", "--set", "rollout.group_size=1000"],
     "exceeds 2^31"),
    (["train", "--config", "{latin1}"], "is not UTF-8 text"),
    (["train", "--config", "{dup}"], "key 'lr' is given twice (lines 2 and 4)"),
    (["train", "--model", "{notmodel}"], "is a folder but not a model"),
    (["rollout", "--split", "foo", "--policy", "expert", "--out", "{folder}/e.jsonl"],
     "unknown split 'foo'; valid: train, eval"),
    (["rollout", "--policy", "expert", "--out", "{folder}"], "is a folder; give a file name"),
    (["train", "--out", "{afile}"], "--out {afile} is a file"),
    (["train", "--out", "{afile}/run"], "cannot create the folder"),
    (["eval", "--json", "{folder}"], "--json {folder} is a folder"),
    (["diagnose", "tool-calls", "--run", "{folder}", "--json", "{folder}"], "is a folder"),
    (["train", "--method", "gpro"], "did you mean 'grpo'"),
    # every plugin name, before a model loads (`app.preflight.check_names`)
    (["train", "--set", "algo.focus_allocator=unifrom"], "did you mean 'uniform'"),
    (["train", "--set", "algo.focus_gain=baye"], "algo.focus_gain must be one of plugin, bayes"),
    (["train", "--set", "algo.estimator=gea"], "unknown estimator 'gea'"),
    (["train", "--set", "algo.loss=ppo_clp"], "did you mean 'ppo_clip'"),
    (["train", "--set", "algo.controller=lineer"], "did you mean 'linear'"),
    (["train", "--set", "context.operator=compactoin"], "did you mean 'compaction'"),
    (["train", "--method", "vineppo", "--set", "rollout.workers=2"], "runs in process only"),
    (["eval", "--set", "algo.focus_allocator=nope"], "unknown focus allocator 'nope'"),
    (["rollout", "--method", "focus", "--set", "algo.focus_gain=x", "--out", "{folder}/t.jsonl"],
     "algo.focus_gain must be one of"),
]


@pytest.mark.parametrize("args, needle", MISTAKES, ids=[" ".join(a)[:50] for a, _ in MISTAKES])
def test_user_mistakes_are_one_line_exit_2_before_any_work(tmp_path, monkeypatch, args, needle):
    paths = {k: str(v) for k, v in _bad_inputs(tmp_path).items()}
    _no_work(monkeypatch)
    res = runner.invoke(app, [a.format(**paths) for a in args])
    _one_line_exit_2(res, needle.format(**paths))


def test_unwritable_output_is_one_line(tmp_path, monkeypatch):
    if os.geteuid() == 0:               # root writes anywhere: make the check itself say no
        monkeypatch.setattr(os, "access", lambda p, mode: False)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        _no_work(monkeypatch)
        res = runner.invoke(app, ["eval", "--json", str(ro / "r.json")])
        _one_line_exit_2(res, "is not writable")
    finally:
        ro.chmod(0o700)


def test_bfcl_message_does_not_tell_a_user_of_split_eval_to_use_split_eval(tmp_path):
    res = runner.invoke(app, ["rollout", "--env", "bfcl-multi-turn-base", "--split", "eval",
                              "--n", "1", "--out", str(tmp_path / "e.jsonl"), *_cli_sets(MICRO)])
    assert res.exit_code == 2, res.output
    assert "use --split eval" not in res.output and "only an eval split" in res.output


def test_near_miss_suggestions_rank_edit_distance():
    from agentrl_cli.methods import METHODS
    from agentrl_cli.registry import edit_distance, suggest

    assert edit_distance("gpro", "grpo") == 1 and edit_distance("gpro", "gspo") == 2
    assert suggest("gpro", METHODS.names()) == "grpo"
    assert suggest("foucs", METHODS.names()) == "focus"
    assert suggest("zzzzzz", METHODS.names()) is None
    with pytest.raises(ConfigError, match="did you mean 'rollout.group_size'"):
        config.load(sets=["rollout.groupsize=2"])
