"""Every experiments/*-cpu.yaml runs as written: its tiny agent ships with the package (the
first command trains at once, on every machine the same start) and one training step runs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl_cli.cli.main import app
from agentrl_cli.models import tiny
from agentrl_cli.models.loading import tiny_recipe
from agentrl_cli.app.preflight import load_config

ROOT = Path(__file__).resolve().parents[1]
CPU = sorted((ROOT / "experiments").glob("*-cpu.yaml"))
runner = CliRunner()


def shipped_agent(path: Path) -> Path:
    """The shipped build an experiment file's tiny recipe loads; fails the test when none ships
    (a step would build it first)."""
    recipe = tiny_recipe(load_config(path, None))
    folder = tiny.shipped_path(recipe)
    assert folder is not None, f"{path.name}: no shipped build of recipe {recipe.key()} ({recipe.env})"
    return folder


@pytest.mark.parametrize("path", CPU, ids=lambda p: p.stem)
def test_a_cpu_experiment_loads_a_shipped_agent(path):
    folder = shipped_agent(path)
    built = json.loads((folder / "recipe.json").read_text())
    # the agent starts with room above it and below it
    assert 0.15 <= built["base_success"] <= 0.5, (folder.name, built["base_success"])


@pytest.mark.parametrize("path", CPU, ids=lambda p: p.stem)
def test_a_cpu_experiment_runs_a_step_as_written(path, tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    shipped_agent(path)
    out = tmp_path / "run"
    r = runner.invoke(app, ["train", "--config", str(path), "--out", str(out),
                            "--set", "train.steps=1", "--set", "train.eval_every=0",
                            "--set", "train.critic_warmup=0"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "reward/mean" in row] == [1], r.output
    # nothing was built: the shipped agent was loaded
    cache = tmp_path / "cache"
    assert not cache.exists() or not any(p.name.startswith("tiny-") for p in cache.iterdir())
