"""Build tiny-model variants from recipe overrides and print their warm-up curves.

    OMP_NUM_THREADS=1 python benchmarks/warmup_variants.py OUT_DIR NAME='{"relations": "single", ...}' ...

Each NAME=JSON builds `TinyRecipe(**JSON)` into OUT_DIR/NAME (one process per variant, so run
at most as many as there are cores) and logs its checks' success (dev questions) and the kept checkpoint's held-out success; the final
table reads every OUT_DIR/*/recipe.json. Set `"target_success": 1.0` to see the whole curve.
The recipe variants in docs/results.md were run this way, two at a time.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build_one(out: Path, overrides: dict) -> None:
    import time

    from agentrl_cli.models.tiny import TinyRecipe
    from agentrl_cli.train import tiny_build
    from agentrl_cli.train.tiny_build import build_tiny

    tiny_build.BUILD_THREADS = 1      # side-by-side builds, one core each (1-thread curves differ
                                # from the default 2-thread build's only in float rounding)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    build_tiny(TinyRecipe.from_flat(overrides), out,
               log=lambda s: print(f"[{time.time() - t0:6.0f}s] {s}", flush=True))


def table(root: Path) -> None:
    rows = []
    for f in sorted(root.glob("*/recipe.json")):
        info = json.loads(f.read_text())
        curve = " ".join(f"{h['step']}:{h.get('dev_success', h.get('success')):.2f}" for h in info["history"])
        base = info.get("base_success")
        rows.append(f"{f.parent.name:12s} {info['build_seconds']:6.0f}s  kept {info['warmup_steps']}, "
                    f"held-out {base if base is None else round(base, 3)}  checks {curve}")
    print("\n".join(rows))


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--one":
        build_one(Path(sys.argv[2]), json.loads(sys.argv[3]))
        return
    root = Path(sys.argv[1])
    root.mkdir(parents=True, exist_ok=True)
    procs = []
    for arg in sys.argv[2:]:
        name, blob = arg.split("=", 1)
        log = open(root / f"{name}.log", "w")
        procs.append(subprocess.Popen([sys.executable, __file__, "--one", str(root / name), blob],
                                      stdout=log, stderr=subprocess.STDOUT))
    for p in procs:
        p.wait()
    table(root)


if __name__ == "__main__":
    main()
