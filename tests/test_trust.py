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
from agentrl_cli.app.train import train as checked_train

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
    with RunFolder.open(d, log=lambda s: None) as folder:  # a new folder: marked, files claimed
        (d / "config.json").write_text("{}")
        folder.claim(files=["checkpoints/latest"], checkpoints=["step-000001"])
        (d / "checkpoints" / "step-000001").mkdir(parents=True)
        (d / "checkpoints" / "step-000001" / "w.bin").write_text("w")
        (d / "checkpoints" / "step-000001" / "manifest.json").write_text(
            json.dumps({"files": {"w.bin": {"size": 1, "sha256": ""}}}))
        (d / "checkpoints" / "latest").write_text("step-000001")
        (d / "metrics.jsonl").write_text("")
    marker = json.loads((d / MARKER).read_text())
    assert {"config.json", "checkpoints/latest", "metrics.jsonl"} <= set(marker["files"])
    assert marker["checkpoints"] == ["step-000001"] and marker["dirs"] == ["checkpoints"]
    assert "wandb" not in marker["files"] and marker["sinks"] == []    # no sink opened
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
    (d / "wandb").mkdir()
    (d / "wandb" / "mine").write_text("x")
    before = _snapshot(d)
    with pytest.raises(ConfigError, match=f"holds wandb/mine, which {MARKER} does not list"):
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
    with pytest.raises(ConfigError, match="holds config.json, metrics.jsonl, which"):
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


# ------------------------------------------------------------------ checkpoints are data
SETS = MICRO + ["train.steps=2", "train.save_every=1", "train.eval_every=2",
                "rollout.max_new_tokens=6"]


@pytest.fixture(scope="module")
def micro_run(tmp_path_factory) -> Path:
    """Two grpo steps on the micro model, a checkpoint after each."""
    from agentrl_cli import config
    from agentrl_cli.train import loop

    out = tmp_path_factory.mktemp("trust") / "run"
    checked_train(config.load(method="grpo", sets=SETS), out, log=lambda s: None)
    return out


def _copy(run: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(run, dst)
    return dst


class _Boom:
    """A pickle that would create a file when unpickled."""

    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        import os
        return (os.system, (f"touch {self.target}",))


def _plant_pickle(ckpt: Path, target: Path) -> None:
    """Replace the trainer state with a code-running pickle, and re-sign the manifest so the
    checkpoint verifies (someone else's checkpoint can do both)."""
    import torch

    from agentrl_cli.train import checkpoint

    state = checkpoint.load_state(ckpt)
    state["optimizer"] = _Boom(target)
    torch.save(state, ckpt / checkpoint.STATE_FILE)
    (ckpt / checkpoint.MANIFEST).unlink()
    checkpoint.write_manifest(ckpt)
    assert checkpoint.verify(ckpt) is None


def test_the_trainer_state_is_tensors_and_plain_data(micro_run):
    import torch

    from agentrl_cli.train import checkpoint

    f = checkpoint.step_dir(micro_run, 2) / checkpoint.STATE_FILE
    state = torch.load(f, map_location="cpu", weights_only=True)
    assert state["step"] == 2 and "optimizer" in state


def test_rng_states_become_plain_data_and_restore_exactly():
    import io
    import random

    import numpy as np
    import torch

    from agentrl_cli.train.checkpoint import plain_state

    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state(), "n": np.float32(1.5)}
    want = (random.random(), np.random.rand(), torch.rand(1).item())
    buf = io.BytesIO()
    torch.save(plain_state(state), buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=True)
    random.setstate(back["python"])
    name, keys, *rest = back["numpy"]
    np.random.set_state((name, keys.numpy(), *rest))
    torch.set_rng_state(back["torch"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == want
    assert back["n"] == 1.5 and type(back["n"]) is float
    with pytest.raises(TypeError, match=r"state\['f'\] is a function"):
        plain_state({"f": lambda: 0})


def test_a_pickle_that_would_run_code_is_refused(micro_run, tmp_path):
    """--resume and diagnose on a checkpoint whose trainer state would run code when
    unpickled: one line, exit 2, and the code never runs."""
    from agentrl_cli.train import checkpoint

    run = _copy(micro_run, tmp_path / "run")
    target = tmp_path / "pwned"
    _plant_pickle(checkpoint.step_dir(run, 2), target)
    (run / "summary.json").unlink()
    res = runner.invoke(app, ["train", "--resume", str(run)])
    _one_line_exit_2(res, "holds more than tensors and plain data, refused")
    assert not target.exists()
    res = runner.invoke(app, ["diagnose", "variance", "--checkpoint", str(run), "--episodes", "1",
                              "--png", str(tmp_path / "v.png")])
    _one_line_exit_2(res, "holds more than tensors and plain data, refused")
    assert not target.exists()
    with pytest.raises(checkpoint.UnsafeCheckpoint):
        checkpoint.load_state(checkpoint.step_dir(run, 2))
    assert not target.exists()


# ---------------------------------------------------- every read of a checkpoint verifies it
def _flip_weights(ckpt: Path) -> None:
    f = ckpt / "model.safetensors"
    b = bytearray(f.read_bytes())
    b[-5] ^= 0xFF                          # same size: only the sha256 can tell
    f.write_bytes(bytes(b))


READERS = {
    "eval": lambda c, tmp: ["eval", "--checkpoint", str(c), "--tasks", "1", "--n", "1"],
    "rollout": lambda c, tmp: ["rollout", "--checkpoint", str(c), "--n", "1",
                               "--out", str(tmp / "e.jsonl"),
                               *[a for s in MICRO for a in ("--set", s)]],
    "diagnose variance": lambda c, tmp: ["diagnose", "variance", "--checkpoint", str(c),
                                         "--episodes", "1", "--png", str(tmp / "v.png")],
    "diagnose audit-tree": lambda c, tmp: ["diagnose", "audit-tree", "--checkpoint", str(c),
                                           "--png", str(tmp / "a.png")],
}


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("damage", ["weights corrupted, same size", "no manifest"])
@pytest.mark.parametrize("given", ["run folder", "checkpoint folder"])
def test_every_reader_refuses_a_damaged_checkpoint(micro_run, tmp_path, monkeypatch, reader,
                                                   damage, given):
    """No reader loads a checkpoint that does not verify, and none silently takes an older
    one: one line naming the damaged checkpoint, exit 2, before any model is loaded."""
    import agentrl_cli.models.loading as ml
    from agentrl_cli.train import checkpoint

    run = _copy(micro_run, tmp_path / "run")
    newest = checkpoint.step_dir(run, 2)
    if damage == "no manifest":
        (newest / checkpoint.MANIFEST).unlink()
    else:
        _flip_weights(newest)

    def boom(*a, **k):
        raise AssertionError("a model was loaded from a damaged checkpoint")
    monkeypatch.setattr(ml, "load_policy", boom)
    res = runner.invoke(app, READERS[reader](run if given == "run folder" else newest, tmp_path))
    _one_line_exit_2(res, f"checkpoint {newest} is damaged")
    assert ("no manifest.json" if damage == "no manifest" else "sha256") in res.output
    assert f"pass --checkpoint {checkpoint.step_dir(run, 1)}" in res.output


def test_a_reader_names_the_checkpoint_it_uses(micro_run, tmp_path):
    from agentrl_cli.train import checkpoint

    res = runner.invoke(app, READERS["rollout"](micro_run, tmp_path))
    assert res.exit_code == 0, res.output
    assert f"checkpoint: {checkpoint.step_dir(micro_run, 2)} (verified)" in res.output


# ------------------------------------------------------- a resume continues the same run
@pytest.mark.parametrize("args, needle", [
    (["--method", "ppo"], "--method would change the resumed run"),
    (["--env", "locate"], "--env locate would change the resumed run (it ran with env search)"),
    (["--seed", "1"], "--seed would change the resumed run"),
    (["--config", "x.yaml"], "--config would change the resumed run"),
    (["--model", "tiny"], "--model would change the resumed run"),
    (["--benchmark", "anything"], "--benchmark would change the resumed run"),
    (["--set", "train.lr=1e-3"], "--set train.lr=0.001 would change the resumed run"),
    (["--set", "rollout.group_size=4", "--steps", "3"], "--set rollout.group_size=4 would change"),
])
def test_resume_refuses_options_that_change_the_run(micro_run, tmp_path, monkeypatch, args,
                                                    needle):
    import agentrl_cli.models.loading as ml
    from agentrl_cli.train import loop

    run = _copy(micro_run, tmp_path / "run")
    before = _snapshot(run)

    def boom(*a, **k):
        raise AssertionError("work started before the mistake was reported")
    monkeypatch.setattr(loop, "open_runtime", boom)
    monkeypatch.setattr(ml, "load_policy", boom)
    res = runner.invoke(app, ["train", "--resume", str(run), *args])
    _one_line_exit_2(res, needle)
    assert _snapshot(run) == before


def test_resume_on_a_finished_run_leaves_it(micro_run, tmp_path, monkeypatch):
    from agentrl_cli.train import loop

    run = _copy(micro_run, tmp_path / "run")
    before = _snapshot(run)
    monkeypatch.setattr(loop, "open_runtime", lambda *a, **k: pytest.fail("work started"))
    res = runner.invoke(app, ["train", "--resume", str(run)])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "is finished (2 steps" in lines[0], res.output
    assert _snapshot(run) == before


def test_what_a_resume_changed_is_recorded(micro_run, tmp_path):
    """Raising train.steps (and how often to check) continues the run; the marker's
    `resumes` keeps the values it started with."""
    run = _copy(micro_run, tmp_path / "run")
    res = runner.invoke(app, ["train", "--resume", str(run), "--steps", "3",
                              "--set", "train.eval_every=3"])
    assert res.exit_code == 0, res.output
    marker = json.loads((run / MARKER).read_text())
    assert marker["resumes"][-1]["changed"] == {"train.steps": [2, 3], "train.eval_every": [2, 3]}
    assert json.loads((run / "summary.json").read_text())["steps"] == 3


# ---------------------------------------------------- bounds and cross-key checks, before work
def _bomb(levels: int = 9) -> str:
    """The "billion laughs": each level is ten aliases of the one before (10^levels strings)."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


def test_a_yaml_alias_bomb_is_refused_before_it_is_built(tmp_path, monkeypatch):
    import yaml

    from agentrl_cli import config

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_bomb())
    assert bomb.stat().st_size < 2048

    def never(*a, **k):
        raise AssertionError("the YAML was constructed")
    monkeypatch.setattr(yaml, "load", never)
    with pytest.raises(ConfigError, match="expands to more than 100,000 YAML nodes"):
        config.read_yaml(bomb)
    monkeypatch.undo()                    # the CLI also reads benchmarks.yaml
    res = runner.invoke(app, ["train", "--config", str(bomb)])
    _one_line_exit_2(res, "expands to more than 100,000 YAML nodes")


def test_yaml_aliases_within_bounds_still_load(tmp_path):
    from agentrl_cli import config

    p = tmp_path / "ok.yaml"
    p.write_text("rollout: &r\n  group_size: 4\ntrain:\n  steps: 3\n")
    assert config.read_yaml(p) == {"rollout.group_size": 4, "train.steps": 3}


def test_a_huge_yaml_file_is_refused_unread(tmp_path, monkeypatch):
    from agentrl_cli import config

    p = tmp_path / "big.yaml"
    p.write_text("train:\n  steps: 3\n" + "#" * (config.YAML_BYTES_CAP + 10) + "\n")
    monkeypatch.setattr(config.loading, "check_yaml", lambda *a: pytest.fail("the file was parsed"))
    with pytest.raises(ConfigError, match="a config is at most 1,048,576"):
        config.read_yaml(p)


@pytest.mark.parametrize("args, needle", [
    (["train", "--set", "rollout.max_new_tokens=900", "--set", "rollout.max_tokens=800"],
     "rollout.max_new_tokens (900) must be <= rollout.max_tokens (800)"),
    (["train", "--set", "train.eval_tasks=100"],
     "train.eval_tasks=100 is above the search eval split's 60 tasks"),
    (["eval", "--tasks", "61"], "--tasks=61 is above the search eval split's 60 tasks"),
    (["train", "--seed", str(10**30)], "seed must be <= 9,223,372,036,854,775,807"),
    (["train", "--set", "seed=-1"], "seed must be >= 0"),
    (["train", "--set", "env.n_train=0"], "env.n_train must be > 0, got 0"),
    (["train", "--set", "env.n_eval=0"], "env.n_eval must be > 0, got 0"),
])
def test_cross_key_and_bound_mistakes_are_one_line(tmp_path, monkeypatch, args, needle):
    import agentrl_cli.models.loading as ml
    from agentrl_cli.train import loop

    def boom(*a, **k):
        raise AssertionError("work started before the mistake was reported")
    monkeypatch.setattr(loop, "open_runtime", boom)
    monkeypatch.setattr(ml, "load_policy", boom)
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, args)
    _one_line_exit_2(res, needle)
    assert not (tmp_path / "runs").exists()           # no run folder left behind


def test_rollout_keeps_an_existing_out_file(tmp_path, monkeypatch):
    out = tmp_path / "episodes.jsonl"
    out.write_text("the user's\n")
    args = ["rollout", "--policy", "expert", "--n", "1", "--out", str(out),
            *[a for s in MICRO for a in ("--set", s)]]
    res = runner.invoke(app, args)
    _one_line_exit_2(res, f"--out {out} exists: pass --overwrite")
    assert out.read_text() == "the user's\n"
    res = runner.invoke(app, [*args, "--overwrite"])
    assert res.exit_code == 0, res.output
    assert out.read_text() != "the user's\n"
