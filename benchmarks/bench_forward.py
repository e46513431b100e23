"""What one decode forward of the engine costs on the tiny build, by rows and context: the
fixed part every forward pays however few rows it carries, and what each row and each column
of context adds. A tree rollout that runs half as many rows per forward as a linear one pays
the fixed part twice per generated token (`benchmarks/bench_step.py`: rows per decode forward).

    python benchmarks/bench_forward.py [--rows 1,8,26,51] [--context 40,200] [--threads 1]

For each (rows, context) a fresh `KVBatch` prefills `rows` rows of `context` tokens, then
decodes one token per row per forward; it prints the median milliseconds per forward over
`--reps` repetitions of `--forwards` forwards, and a least-squares fit
`ms = fixed + rows x (per_row + context x per_column)`.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl_cli import config  # noqa: E402
from agentrl_cli.engines import hf  # noqa: E402
from agentrl_cli.app.tiny_build import load_policy  # noqa: E402


def per_forward(model, pad_id: int, rows: int, context: int, forwards: int, reps: int) -> float:
    gen = torch.Generator().manual_seed(0)
    times = []
    for _ in range(reps):
        kv = hf.HFEngine(model, pad_id).new_batch(0)
        for _ in range(rows):
            kv.add_row()
        kv.extend([torch.randint(3, model.config.vocab_size, (context,), generator=gen).tolist()
                   for _ in range(rows)], only_fed=True)
        kv.extend([[5]] * rows, only_fed=True)                 # buffers warmed
        t = time.perf_counter()
        for _ in range(forwards):
            kv.extend([[5]] * rows, only_fed=True)
        times.append((time.perf_counter() - t) / forwards * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,8,26,51")
    ap.add_argument("--context", default="40,200")
    ap.add_argument("--forwards", type=int, default=40)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model, _, fmt, _ = load_policy(config.load(), log=lambda s: None)
    pts = []
    print(f"{'rows':>5} {'context':>8} {'ms / forward':>13} {'ms / row':>9}")
    for r in map(int, a.rows.split(",")):
        for c in map(int, a.context.split(",")):
            ms = per_forward(model, fmt.pad_id, r, c, a.forwards, a.reps)
            pts.append((r, c, ms))
            print(f"{r:>5} {c:>8} {ms:>13.3f} {ms / r:>9.3f}")
    # ms = fixed + rows * per_row + rows * context * per_column
    X = torch.tensor([[1.0, r, r * c] for r, c, _ in pts], dtype=torch.float64)
    y = torch.tensor([ms for _, _, ms in pts], dtype=torch.float64)
    fixed, per_row, per_col = torch.linalg.lstsq(X, y[:, None]).solution[:, 0].tolist()
    print(f"fit: fixed {fixed:.3f} ms per forward, {per_row * 1e3:.1f} us per row, "
          f"{per_col * 1e6:.1f} ns per row per context token")
    for r in (26, 51):
        share = fixed / (fixed + r * (per_row + 185 * per_col))
        print(f"  at {r} rows and 185 tokens of context the fixed part is {share:.0%} of a forward")


if __name__ == "__main__":
    main()
