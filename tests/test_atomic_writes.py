"""A run's `config.json` and `checkpoints/latest` (and the reports written whole) are written
atomically: a temp file in the same folder, then `os.replace`; a kill in between leaves the old
file, never a torn one."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from agentrl_cli.train import checkpoint, run_folder
from agentrl_cli.train.run_folder import atomic_write_text

ROOT = Path(__file__).resolve().parents[1] / "agentrl_cli"


def test_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    atomic_write_text(path, '{"old": 1}')
    assert json.loads(path.read_text()) == {"old": 1}

    def killed(src, dst):
        raise KeyboardInterrupt          # the process dies between the write and the rename

    monkeypatch.setattr(run_folder.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(path, '{"new": 2}')
    assert json.loads(path.read_text()) == {"old": 1}
    temps = [p for p in tmp_path.iterdir() if p != path]
    assert len(temps) == 1 and temps[0].name.startswith(".config.json.")   # beside it: same disk


class _Saves:
    """A model / tokenizer stand-in: `save_pretrained` writes one file."""

    def __init__(self, name: str):
        self.name = name

    def save_pretrained(self, folder, **kw):
        (Path(folder) / self.name).write_text("x")


def test_checkpoint_latest_is_written_atomically(tmp_path, monkeypatch):
    calls = []

    def spy(path, text):
        calls.append((Path(path), text))
        atomic_write_text(path, text)

    monkeypatch.setattr(checkpoint, "atomic_write_text", spy)
    final = checkpoint.save(tmp_path, 3, _Saves("model.safetensors"), _Saves("tokenizer.json"), {})
    assert calls == [(tmp_path / "checkpoints" / "latest", final.name)]
    assert (tmp_path / "checkpoints" / "latest").read_text() == final.name


def _names(node: ast.AST, name: str) -> bool:
    return any(isinstance(c, ast.Constant) and c.value == name for c in ast.walk(node))


def test_the_trainer_writes_config_json_through_the_atomic_helper():
    tree = ast.parse((ROOT / "train" / "loop.py").read_text())
    calls = [c for c in ast.walk(tree) if isinstance(c, ast.Call)]
    assert any(isinstance(c.func, ast.Name) and c.func.id == "atomic_write_text"
               and c.args and _names(c.args[0], "config.json") for c in calls)
    # and never with a plain write or open
    for c in calls:
        if isinstance(c.func, ast.Attribute) and c.func.attr in ("write_text", "write_bytes", "open"):
            assert not _names(c.func.value, "config.json")
        if isinstance(c.func, ast.Name) and c.func.id == "open":
            assert not (c.args and _names(c.args[0], "config.json"))
