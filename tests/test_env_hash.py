"""A user env's file and sha256 are recorded with the run: `--resume` and `agentrl eval
--checkpoint RUN` refuse a changed file (one line, the file and both hashes) unless
`--allow-env-change`, which runs and records the change; a moved file is accepted with
`--resume RUN --env NEW_PATH:make` when its hash matches. Real runs on the example env."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl_cli.cli.main import app
from agentrl_cli.train.run_folder import MARKER
from conftest import MICRO

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "calculator_env.py"
runner = CliRunner(env={"COLUMNS": "1000"})
SETS = [a for s in [*MICRO, "env.n_ops=1", "train.eval_tasks=2"] for a in ("--set", s)]


def _one_line_exit_2(res, *needles: str) -> str:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else None)
            for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def env_run(model_dir, tmp_path_factory) -> tuple[Path, Path]:
    """(a 1-step run on a user env file, that file)."""
    d = tmp_path_factory.mktemp("envhash")
    env = d / "my_env.py"
    shutil.copy(EXAMPLE, env)
    out = d / "run"
    res = runner.invoke(app, ["train", "--method", "grpo", "--env", f"{env}:make",
                              "--model", model_dir, "--out", str(out), *SETS,
                              "--set", "train.steps=1"])
    assert res.exit_code == 0, res.output
    return out, env


def _copy(env_run, tmp_path) -> tuple[Path, Path]:
    """The run and its env file, copied; the copy's config names the copied file."""
    run, env = env_run
    new_env = tmp_path / "my_env.py"
    shutil.copy(env, new_env)
    new_run = tmp_path / "run"
    shutil.copytree(run, new_run)
    cfg = json.loads((new_run / "config.json").read_text())
    cfg["env"]["name"] = f"{new_env}:make"
    (new_run / "config.json").write_text(json.dumps(cfg))
    return new_run, new_env


def test_the_run_records_its_env_files_sha256(env_run):
    run, env = env_run
    rec = json.loads((run / MARKER).read_text())["env"]
    assert rec == {"name": f"{env}:make", "file": str(env), "sha256": _sha(env)}


def test_a_builtin_env_records_no_hash(tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, ["train", "--method", "grpo", "--out", str(out),
                              *[a for s in MICRO for a in ("--set", s)], "--set", "train.steps=1"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / MARKER).read_text()).get("env") is None


def test_a_changed_env_file_is_refused_by_resume_and_eval(env_run, tmp_path):
    run, env = _copy(env_run, tmp_path)
    old = _sha(env)
    env.write_text(env.read_text() + "\n# changed\n")
    new = _sha(env)
    before = _snapshot(run)
    res = runner.invoke(app, ["train", "--resume", str(run), "--steps", "2"])
    _one_line_exit_2(res, f"env file {env} changed", old[:12], new[:12], "--allow-env-change")
    res = runner.invoke(app, ["eval", "--checkpoint", str(run), "--n", "1", "--tasks", "1"])
    _one_line_exit_2(res, f"env file {env} changed", old[:12], new[:12], "--allow-env-change")
    assert _snapshot(run) == before


def test_allow_env_change_runs_and_records_the_change(env_run, tmp_path):
    run, env = _copy(env_run, tmp_path)
    old = _sha(env)
    env.write_text(env.read_text() + "\n# changed\n")
    new = _sha(env)
    res = runner.invoke(app, ["eval", "--checkpoint", str(run), "--n", "1", "--tasks", "1",
                              "--allow-env-change"])
    assert res.exit_code == 0, res.output
    log = (run / "env-changes.log").read_text().splitlines()
    assert len(log) == 1 and "eval --checkpoint step-000001" in log[0]
    assert f"{old} -> {new}" in log[0] and str(env) in log[0]
    res = runner.invoke(app, ["train", "--resume", str(run), "--steps", "2", "--allow-env-change"])
    assert res.exit_code == 0, res.output
    marker = json.loads((run / MARKER).read_text())
    assert marker["resumes"][-1]["env_changed"] == {"file": str(env), "from": old, "to": new}
    assert marker["env"]["sha256"] == new              # the run goes on with the new file
    assert "train --resume" in (run / "env-changes.log").read_text().splitlines()[1]
    assert "env-changes.log" in marker["files"]        # --overwrite removes it with the run


def test_a_moved_env_file_resumes_with_env_when_its_hash_matches(env_run, tmp_path):
    run, env = _copy(env_run, tmp_path)
    moved = tmp_path / "elsewhere" / "calc.py"
    moved.parent.mkdir()
    env.rename(moved)
    res = runner.invoke(app, ["train", "--resume", str(run), "--steps", "2"])
    _one_line_exit_2(res, f"env file {env} is not there", f"--env NEW_PATH.py:make")
    twin = tmp_path / "twin.py"                        # same factory, other code
    twin.write_text(moved.read_text() + "\n# not the same\n")
    res = runner.invoke(app, ["train", "--resume", str(run), "--env", f"{twin}:make", "--steps", "2"])
    _one_line_exit_2(res, f"env file {twin} changed", _sha(moved)[:12], _sha(twin)[:12])
    res = runner.invoke(app, ["train", "--resume", str(run), "--env", f"{moved}:other", "--steps", "2"])
    _one_line_exit_2(res, f"--env {moved}:other would change the resumed run")
    res = runner.invoke(app, ["train", "--resume", str(run), "--env", f"{moved}:make", "--steps", "2"])
    assert res.exit_code == 0, res.output
    assert json.loads((run / "config.json").read_text())["env"]["name"] == f"{moved}:make"
    marker = json.loads((run / MARKER).read_text())
    assert marker["resumes"][-1]["changed"]["env.name"] == [f"{env}:make", f"{moved}:make"]
    assert marker["env"]["file"] == str(moved)
    res = runner.invoke(app, ["eval", "--checkpoint", str(run), "--n", "1", "--tasks", "1"])
    assert res.exit_code == 0, res.output             # the run's own env, at its new place


def test_resume_accepts_the_runs_own_method_only(env_run, tmp_path):
    run, _ = _copy(env_run, tmp_path)
    res = runner.invoke(app, ["train", "--resume", str(run), "--method", "ppo", "--steps", "2"])
    _one_line_exit_2(res, "--method would change the resumed run")
    res = runner.invoke(app, ["train", "--resume", str(run), "--method", "grpo", "--steps", "2"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
