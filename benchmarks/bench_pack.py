"""What a KV-cache pack (`KVBatch.pack`, the defragmentation of the layout with holes, which the
`hf` engine keeps for models with sliding-window layers, run when the cache is much wider than
its longest row) costs, with the column move as shipped
(`engines/kv_batch.py: _move_columns`: whole head vectors by index_select, one strided copy) and with the
`torch.gather` over an expanded index it replaced, side by side in one run.

    python benchmarks/bench_pack.py [--rows 120] [--steps 40] [--reps 7] [--threads 1]

A batch of `--rows` rows of the tiny build is fed 5 tokens at a time, each row every third
step, so every row holds holes where the others were fed (as in continuous batching). Each
repetition packs a copy of that batch once per form, the forms taking turns; it prints the
median milliseconds per pack, the ratio, and whether both give the same cache.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl_cli import config  # noqa: E402
from agentrl_cli.engines import kv_batch  # noqa: E402
from agentrl_cli.app.tiny_build import load_policy  # noqa: E402


def gather_columns(src: torch.Tensor, dst: torch.Tensor, idx: torch.Tensor, n: int) -> None:
    """The former move: `torch.gather` along the columns with an expanded index."""
    g = idx[:, None, :, None].expand(-1, src.shape[1], -1, src.shape[3])
    torch.gather(src[:n], 2, g, out=dst[:n, :, :idx.shape[1]])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=120)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model, _, fmt, _ = load_policy(config.load(), log=lambda s: None)
    kv = kv_batch.KVBatch(model, 0, fmt.pad_id)            # the layout with holes (sliding-window models)
    gen = torch.Generator().manual_seed(0)
    for _ in range(a.rows):
        kv.add_row()
    for t in range(a.steps):
        chunks = [torch.randint(3, model.config.vocab_size, (5,), generator=gen).tolist()
                  if (r + t) % 3 == 0 else None for r in range(kv.n)]
        kv.extend(chunks, only_fed=True)
    print(f"{kv.n} rows, cache {kv.mask.shape[1]} columns wide, longest row {int(kv.lengths.max())}")
    shipped = kv_batch._move_columns
    times: dict[str, list[float]] = {"index_select": [], "gather": []}
    packed = {}
    for _ in range(a.reps):
        for name, move in (("index_select", shipped), ("gather", gather_columns)):
            b = copy.deepcopy(kv)
            kv_batch._move_columns = move
            t0 = time.perf_counter()
            b.pack()
            times[name].append(time.perf_counter() - t0)
            packed[name] = [(layer.keys.clone(), layer.values.clone()) for layer in b.cache.layers]
    kv_batch._move_columns = shipped
    same = all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
               for x, y in zip(packed["index_select"], packed["gather"]))
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    print(f"ms per pack: index_select {med['index_select']:.1f}, gather {med['gather']:.1f}; "
          f"gather / index_select {med['gather'] / med['index_select']:.2f}x; "
          f"same cache: {same}")


if __name__ == "__main__":
    main()
