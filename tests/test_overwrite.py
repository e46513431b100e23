"""`--overwrite` removes only what agentrl wrote.

The run marker lists files (never folders) a run wrote: its own files, each checkpoint by name
(its files are its manifest's), and the files of the `train.log` sinks that opened. A file the
marker does not list inside the run's folders stops `--overwrite` with one line, nothing removed.
Real `agentrl train` runs on the micro model of conftest.
"""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl_cli.cli.main import app
from agentrl_cli.train import run_folder
from agentrl_cli.train.run_folder import MARKER
from conftest import MICRO

runner = CliRunner(env={"COLUMNS": "1000"})
SETS = MICRO + ["train.steps=2", "train.save_every=1", "train.eval_every=2", "train.trace_every=1",
                "rollout.max_new_tokens=6"]


def _sets(extra=()) -> list[str]:
    return [a for s in [*SETS, *extra] for a in ("--set", s)]


def _snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else None)
            for p in folder.rglob("*")}


def _marker(run: Path) -> dict:
    return json.loads((run / MARKER).read_text())


@pytest.fixture(scope="module")
def tb_run(tmp_path_factory) -> Path:
    """A 2-step run through the CLI with the tensorboard sink."""
    out = tmp_path_factory.mktemp("ow") / "run"
    res = runner.invoke(app, ["train", "--method", "grpo", "--out", str(out),
                              *_sets(["train.log=tensorboard"])])
    assert res.exit_code == 0, res.output
    return out


def _copy(run: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(run, dst, symlinks=True)
    return dst


def test_the_marker_lists_files_checkpoints_by_name_and_only_opened_sinks(tb_run):
    m = _marker(tb_run)
    on_disk = run_folder.files_under(tb_run)
    claimed = run_folder.claimed_files(tb_run, m)
    assert on_disk <= claimed                             # every file there is accounted for
    assert not any((tb_run / f).is_dir() for f in m["files"])   # files, never folders
    assert m["checkpoints"] == ["step-000001", "step-000002"]
    assert not any(f.startswith("checkpoints/step-") for f in m["files"])  # one entry each
    assert m["sinks"] == ["tensorboard"]
    assert any(f.startswith("tensorboard/events.out.tfevents") for f in m["files"])
    assert not any(f.startswith("wandb") for f in m["files"] + m["dirs"])  # never opened
    assert {"checkpoints", "traces", "tensorboard"} <= set(m["dirs"])


def test_a_run_without_sinks_claims_none(tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--method", "grpo", "--out", str(out),
                              *_sets(["train.steps=1", "train.trace_every=0"])])
    assert res.exit_code == 0, res.output
    m = _marker(out)
    assert m["sinks"] == [] and "tensorboard" not in m["dirs"] and "traces" not in m["dirs"]
    assert not any(f.split("/")[0] in ("tensorboard", "wandb", "wandb_id") for f in m["files"])


def test_overwrite_refuses_user_files_inside_the_runs_folders(tb_run, tmp_path):
    """Files the user put in checkpoints/ and wandb/: one line naming them, exit 2, nothing
    removed; once they are moved away, --overwrite removes the old run and keeps the user's
    notes beside it."""
    run = _copy(tb_run, tmp_path / "run")
    (run / "checkpoints" / "my-model.bin").write_bytes(b"precious")
    (run / "checkpoints" / "step-000001" / "notes.txt").write_text("mine")
    (run / "wandb").mkdir()
    (run / "wandb" / "run.log").write_text("mine")
    (run / "notes.txt").write_text("beside the run")
    before = _snapshot(run)
    res = runner.invoke(app, ["train", "--method", "grpo", "--out", str(run), "--overwrite",
                              *_sets(["train.steps=1"])])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    for f in ("checkpoints/my-model.bin", "checkpoints/step-000001/notes.txt", "wandb/run.log"):
        assert f in lines[0]
    assert "nothing was removed" in lines[0] and "notes.txt," not in lines[0].split("holds")[0]
    assert _snapshot(run) == before

    for f in ("checkpoints/my-model.bin", "checkpoints/step-000001/notes.txt", "wandb/run.log"):
        (run / f).unlink()
    (run / "wandb").rmdir()
    res = runner.invoke(app, ["train", "--method", "grpo", "--out", str(run), "--overwrite",
                              *_sets(["train.steps=1", "train.trace_every=0"])])
    assert res.exit_code == 0, res.output
    assert "removed the previous run's" in res.output
    assert (run / "notes.txt").read_text() == "beside the run"
    assert not (run / "tensorboard").exists() and not (run / "traces").exists()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step-000001"]


def test_many_foreign_files_are_a_few_names_then_a_count(tb_run, tmp_path):
    run = _copy(tb_run, tmp_path / "run")
    for i in range(9):
        (run / "traces" / f"mine-{i}.txt").write_text("x")
    with pytest.raises(run_folder.ConfigError, match=r"mine-3.txt and 5 more, which"):
        run_folder.RunFolder.open(run, overwrite=True, log=lambda s: None)


def test_overwrite_removes_exactly_the_listed_files(tb_run, tmp_path):
    """After --overwrite's clearing, nothing of the old run is left, and an unlisted empty
    folder of the user's survives (only folders agentrl made are removed when empty)."""
    run = _copy(tb_run, tmp_path / "run")
    (run / "analysis").mkdir()
    (run / "analysis" / "plot.png").write_bytes(b"png")
    with run_folder.RunFolder.open(run, overwrite=True, log=lambda s: None):
        pass
    left = {p.relative_to(run).as_posix() for p in run.rglob("*")}
    assert left == {".lock", MARKER, "analysis", "analysis/plot.png"}


def _fake_wandb(monkeypatch):
    """A stand-in for the wandb package: init writes a run folder under <dir>/wandb, finish
    writes one more file there (as wandb does)."""
    mod = types.ModuleType("wandb")

    class FakeRun:
        def __init__(self, root: Path, rid: str):
            self.root = root / "wandb" / f"offline-run-0-{rid}"
            (self.root / "files").mkdir(parents=True)
            (self.root / "files" / "config.yaml").write_text("x")
            (root / "wandb" / "debug.log").write_text("log")

        def log(self, *a, **k):
            pass

        def finish(self):
            (self.root / "files" / "output.log").write_text("done")

    mod.init = lambda dir, id, **k: FakeRun(Path(dir), id)
    monkeypatch.setitem(sys.modules, "wandb", mod)


def test_a_wandb_sink_records_its_files_and_overwrite_removes_them(tmp_path, monkeypatch):
    _fake_wandb(monkeypatch)
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--method", "grpo", "--out", str(out),
                              *_sets(["train.steps=1", "train.log=wandb"])])
    assert res.exit_code == 0, res.output
    m = _marker(out)
    assert m["sinks"] == ["wandb"] and "wandb_id" in m["files"]
    assert any(f.endswith("files/output.log") for f in m["files"])   # written at finish
    assert run_folder.files_under(out) <= run_folder.claimed_files(out, m)
    monkeypatch.delitem(sys.modules, "wandb")
    res = runner.invoke(app, ["train", "--method", "grpo", "--out", str(out), "--overwrite",
                              *_sets(["train.steps=1", "train.trace_every=0"])])
    assert res.exit_code == 0, res.output
    assert not (out / "wandb").exists() and not (out / "wandb_id").exists()


def test_a_run_with_a_version_1_marker_resumes_and_overwrites(tb_run, tmp_path):
    """A marker an earlier build wrote (top-level names, folders included): its checkpoints,
    traces and event files are its own; files it cannot vouch for (a wandb/ it named) stop
    --overwrite, one line, nothing removed."""
    run = _copy(tb_run, tmp_path / "run")
    (run / MARKER).write_text(json.dumps({"agentrl_run": 1, "files": list(run_folder.RUN_FILES),
                                          "resumes": []}))
    (run / "wandb").mkdir()
    (run / "wandb" / "debug.log").write_text("x")
    before = _snapshot(run)
    with pytest.raises(run_folder.ConfigError, match="holds wandb/debug.log, which"):
        run_folder.RunFolder.open(run, overwrite=True, log=lambda s: None)
    assert _snapshot(run) == before
    with run_folder.RunFolder.open(run, resume=True, log=lambda s: None) as f:
        f.claim(files=["traces/step-000009.json"], checkpoints=["step-000009"])
    assert "step-000009" in _marker(run)["checkpoints"]
    (run / "wandb" / "debug.log").unlink()
    with run_folder.RunFolder.open(run, overwrite=True, log=lambda s: None):
        pass
    assert {p.relative_to(run).as_posix() for p in run.rglob("*")} == {".lock", MARKER}
