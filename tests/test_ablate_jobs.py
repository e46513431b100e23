"""`agentrl ablate --jobs 2` end to end: real `agentrl train` subprocesses in fresh run folders
(each run folder holds only what its run wrote; the subprocess output goes to <out>/logs)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import MICRO


def test_parallel_sweep_runs_real_subprocesses(tmp_path):
    out = tmp_path / "sweep"
    sets = [a for s in MICRO for a in ("--set", s)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "agentrl_cli.cli.main", "ablate", "--method",
                        "grpo,rloo", "--steps", "1", "--seeds", "1", "--jobs", "2", "--budget", "200",
                        "--out", str(out), *sets], capture_output=True, text=True, env=env,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    for cell in ("grpo", "rloo"):
        run = out / "cells" / cell / "seed-0"
        assert json.loads((run / "summary.json").read_text())["method"] == cell
        assert not (run / "train.log").exists()
        assert (out / "logs" / f"{cell}-seed-0.log").is_file()
