"""What a command says when a run's files or the user's request cannot be served: one line,
true, before any work where possible (eval's sample bound, an interrupted rollout or train, a
full disk during a checkpoint, a trainer state that is a plain pickle)."""
from __future__ import annotations

import errno
import json
import pickle
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl_cli.cli.main import app
from agentrl_cli.train import checkpoint
from conftest import MICRO

runner = CliRunner(env={"COLUMNS": "1000"})
SETS = MICRO + ["train.steps=1", "train.save_every=1", "rollout.max_new_tokens=6"]


def _sets(extra=()) -> list[str]:
    return [a for s in [*SETS, *extra] for a in ("--set", s)]


def _one_line(res, code: int, *needles: str) -> str:
    assert res.exit_code == code, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("msg") / "run"
    res = runner.invoke(app, ["train", "--method", "grpo", "--out", str(out), *_sets()])
    assert res.exit_code == 0, res.output
    return out


@pytest.mark.parametrize("args, needle", [
    (["--pass-k", "100000000"], "--pass-k 100000000 is above the most samples per task, 1024"),
    (["--n", "5000"], "--n 5000 is above the most samples per task, 1024"),
])
def test_eval_bounds_samples_before_any_work(args, needle, monkeypatch):
    import agentrl_cli.app.evaluate as ae           # the names `agentrl eval` calls

    monkeypatch.setattr(ae, "run_eval", lambda *a, **k: pytest.fail("evaluated"))
    monkeypatch.setattr(ae, "ensure_model", lambda *a, **k: pytest.fail("built a model"))
    _one_line(runner.invoke(app, ["eval", *args]), 2, needle)


def test_an_interrupted_rollout_does_not_suggest_resume(tmp_path, monkeypatch):
    import agentrl_cli.app.rollout as tc

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(tc, "collect_rollout", interrupted)
    out = tmp_path / "eps.jsonl"
    line = _one_line(runner.invoke(app, ["rollout", "--out", str(out)]), 130,
                     "interrupted: the --out file was not written")
    assert "--resume" not in line and not out.exists()


def test_an_interrupted_train_says_how_to_continue(tmp_path, monkeypatch):
    import agentrl_cli.app.train as tl

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(tl, "launch", interrupted)
    _one_line(runner.invoke(app, ["train", "--out", str(tmp_path / "r")]), 130,
              "agentrl train --resume <run folder>")


class _Model:
    """A model whose writer fails as a full disk makes it fail."""

    def __init__(self, error: BaseException):
        self.error = error

    def save_pretrained(self, folder, **k):
        (Path(folder) / "model.safetensors").write_bytes(b"partial")
        raise self.error


class _Tok:
    def save_pretrained(self, folder):
        pass


@pytest.mark.parametrize("error, free", [
    (OSError(errno.ENOSPC, "No space left on device"), 10 << 30),
    (RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed "
                  "writing file data/0: file write failed"), 0),
    (Exception("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
               "\"No space left on device\" })"), 10 << 30),
])
def test_a_full_disk_during_a_save_is_one_line_and_leaves_no_temp_folder(tmp_path, monkeypatch,
                                                                         error, free):
    monkeypatch.setattr(checkpoint.shutil, "disk_usage",
                        lambda p: shutil._ntuple_diskusage(free * 2, free, free))
    with pytest.raises(checkpoint.CheckpointWriteError) as e:
        checkpoint.save(tmp_path, 2, _Model(error), _Tok(), {"step": 2})
    msg = str(e.value)
    assert "\n" not in msg and "No space left on device" in msg
    assert f"the disk that holds {tmp_path / 'checkpoints'} is full" in msg
    assert f"continue with --resume {tmp_path}" in msg
    assert list((tmp_path / "checkpoints").iterdir()) == []          # the temp folder is gone


def test_a_bug_in_a_save_is_not_called_a_full_disk(tmp_path):
    with pytest.raises(KeyError):
        checkpoint.save(tmp_path, 2, _Model(KeyError("bug")), _Tok(), {"step": 2})
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_a_full_disk_through_train_is_one_line(tmp_path, monkeypatch):
    def full(*a, **k):
        raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")
    monkeypatch.setattr(checkpoint.torch, "save", full)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage",
                        lambda p: shutil._ntuple_diskusage(1 << 30, 0, 0))
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--method", "grpo", "--out", str(out), *_sets()])
    err = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(err) == 1, res.output
    assert f"cannot write checkpoint {checkpoint.step_dir(out, 1)} (No space left on device)" in err[0]
    assert "is full" in err[0] and not list((out / "checkpoints").glob(".step-*"))


@pytest.mark.parametrize("kind", ["plain pickle", "legacy torch.save"])
def test_eval_of_a_pickled_trainer_state_is_one_line(run, tmp_path, kind):
    import torch

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    ckpt = checkpoint.step_dir(copy, 1)
    state = checkpoint.load_state(ckpt)
    if kind == "plain pickle":
        (ckpt / checkpoint.STATE_FILE).write_bytes(pickle.dumps({"step": state["step"]}))
    else:
        torch.save(state, ckpt / checkpoint.STATE_FILE, _use_new_zipfile_serialization=False)
    (ckpt / checkpoint.MANIFEST).unlink()
    checkpoint.write_manifest(ckpt)                  # whole by its manifest: not "damaged"
    res = runner.invoke(app, ["eval", "--checkpoint", str(copy), "--n", "1", "--tasks", "1"])
    _one_line(res, 2, f"{ckpt / checkpoint.STATE_FILE} cannot be read safely",
              f"agentrl eval --model {ckpt}")
    assert "mmap" not in res.output
    res = runner.invoke(app, ["eval", "--model", str(ckpt), "--n", "1", "--tasks", "1",
                              "--json", str(tmp_path / "e.json")])
    assert res.exit_code == 0, res.output                # what the message suggests works
    assert json.loads((tmp_path / "e.json").read_text())["checkpoint"] is None
