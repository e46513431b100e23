"""Trust boundaries: nothing a user did not write is deleted or run.

A folder that agentrl did not mark as its run folder is never cleared; `--overwrite` removes
exactly what the run's marker lists; checkpoints load as tensors and plain data only (a pickle
that would run code is refused), and every command that reads a checkpoint verifies it first.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl_cli.cli.main import app
from agentrl_cli.errors import ConfigError
from agentrl_cli.train import run_folder
from agentrl_cli.train.run_folder import MARKER, RunFolder
from conftest import MICRO

runner = CliRunner(env={"COLUMNS": "1000"})


def _one_line_exit_2(res, needle: str) -> None:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in res.output, res.output


def _snapshot(folder: Path) -> dict:
    """Every path under `folder` (files with their bytes, folders as None)."""
    return {p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else None)
            for p in folder.rglob("*")}


def _users_folder(tmp_path: Path) -> Path:
    """A folder of the user's own work that happens to use the names a run writes."""
    d = tmp_path / "work"
    (d / "checkpoints").mkdir(parents=True)
    (d / "checkpoints" / "my-model.bin").write_bytes(b"precious")
    (d / "wandb").mkdir()
    (d / "wandb" / "run.log").write_text("mine")
    (d / "tensorboard").mkdir()
    (d / "config.json").write_text('{"mine": true}')
    (d / "metrics.jsonl").write_text('{"step": 1}\n')
    (d / "notes.txt").write_text("notes")
    return d


# ------------------------------------------------------------------ the run folder's marker
@pytest.mark.parametrize("overwrite", [False, True])
def test_a_folder_without_the_marker_is_never_touched(tmp_path, overwrite):
    """`train --out DIR [--overwrite]` on a folder agentrl did not mark: one line, exit 2,
    nothing removed or added (not even the lock file), and no claim that it holds a run."""
    d = _users_folder(tmp_path)
    before = _snapshot(d)
    res = runner.invoke(app, ["train", "--out", str(d), *(["--overwrite"] if overwrite else []),
                              *[a for s in MICRO for a in ("--set", s)]])
    _one_line_exit_2(res, f"{d} is not an agentrl run folder")
    assert "already holds a run" not in res.output
    assert _snapshot(d) == before


def test_a_non_empty_folder_without_run_files_is_refused_too(tmp_path):
    d = tmp_path / "photos"
    d.mkdir()
    (d / "a.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(ConfigError, match="is not an agentrl run folder: it holds a.jpg"):
        RunFolder.open(d, overwrite=True, log=lambda s: None)
    assert sorted(p.name for p in d.iterdir()) == ["a.jpg"]


def test_overwrite_removes_only_what_the_marker_lists(tmp_path):
    d = tmp_path / "run"
    with RunFolder.open(d, log=lambda s: None):            # a new folder: marked, files claimed
        (d / "config.json").write_text("{}")
        (d / "checkpoints" / "step-000001").mkdir(parents=True)
        (d / "metrics.jsonl").write_text("")
    marker = json.loads((d / MARKER).read_text())
    assert {"config.json", "checkpoints", "metrics.jsonl"} <= set(marker["files"])
    (d / "notes.txt").write_text("the user's")               # added later by the user
    (d / "analysis").mkdir()
    with pytest.raises(ConfigError, match="already holds a run"):
        RunFolder.open(d, log=lambda s: None)
    assert (d / "config.json").is_file()
    logged = []
    with RunFolder.open(d, overwrite=True, log=logged.append):
        pass
    assert sorted(p.name for p in d.iterdir()) == sorted([".lock", MARKER, "notes.txt", "analysis"])
    assert "config.json" in logged[0] and "notes.txt" not in logged[0]


def test_a_name_the_marker_does_not_list_blocks_a_fresh_run(tmp_path):
    """A marked folder the user added `wandb/` to: a fresh run there (with or without
    --overwrite) would write into it, so it is refused and nothing is removed."""
    d = tmp_path / "run"
    with RunFolder.open(d, log=lambda s: None):
        (d / "config.json").write_text("{}")
    marker = json.loads((d / MARKER).read_text())
    marker["files"].remove("wandb")
    (d / MARKER).write_text(json.dumps(marker))
    (d / "wandb").mkdir()
    (d / "wandb" / "mine").write_text("x")
    before = _snapshot(d)
    with pytest.raises(ConfigError, match=f"holds wandb, which {MARKER} does not list"):
        RunFolder.open(d, overwrite=True, log=lambda s: None)
    assert _snapshot(d) == before


@pytest.mark.parametrize("files", [["../outside"], ["/etc"], "config.json", [".lock"], [3]])
def test_a_tampered_marker_is_refused_and_nothing_is_removed(tmp_path, files):
    outside = tmp_path / "outside"
    outside.mkdir()
    d = tmp_path / "run"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / MARKER).write_text(json.dumps({"agentrl_run": 1, "files": files}))
    before = _snapshot(tmp_path)
    with pytest.raises(ConfigError, match=f"{MARKER} is damaged"):
        RunFolder.open(d, overwrite=True, log=lambda s: None)
    assert _snapshot(tmp_path) == before


def test_an_older_builds_run_resumes_but_overwrite_refuses(tmp_path):
    """An older build's run folder (run files, no marker): --resume opens it and records a
    marker that lists none of its files; --overwrite refuses it before and after."""
    d = tmp_path / "old"
    (d / "checkpoints").mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "metrics.jsonl").write_text("")
    with pytest.raises(ConfigError, match="not an agentrl run folder.*--resume"):
        RunFolder.open(d, overwrite=True, log=lambda s: None)
    logged = []
    with RunFolder.open(d, resume=True, log=logged.append):
        pass
    assert any("older build" in s for s in logged)
    marker = json.loads((d / MARKER).read_text())
    assert not {"config.json", "checkpoints", "metrics.jsonl"} & set(marker["files"])
    before = _snapshot(d)
    with pytest.raises(ConfigError, match="holds config.json, metrics.jsonl, checkpoints"):
        RunFolder.open(d, overwrite=True, log=lambda s: None)
    assert _snapshot(d) == before


def test_holds_run_reads_the_marker(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / MARKER).write_text(json.dumps({"agentrl_run": 1, "files": ["summary.json"]}))
    (d / "config.json").write_text("{}")                  # not listed: not the run's
    assert not run_folder.holds_run(d)
    (d / "summary.json").write_text("{}")
    assert run_folder.holds_run(d)
