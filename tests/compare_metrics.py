"""Compare two runs' metrics.jsonl for refactors that must not change numbers.

Usage: python tests/compare_metrics.py REF/metrics.jsonl NEW/metrics.jsonl [--tol 0]
Wall-clock keys (time/*, tokens/s, focus/bookkeeping_*) are ignored; every other key must be
present in both rows and equal (or within --tol, absolute, for floats). Exit 1 on a difference.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

WALL_CLOCK = ("time/", "tokens/s", "focus/bookkeeping_")


def wall_clock(key: str) -> bool:
    return any(key == w or key.startswith(w) for w in WALL_CLOCK)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def differences(ref: list[dict], new: list[dict], tol: float = 0.0) -> list[str]:
    out = []
    if len(ref) != len(new):
        out.append(f"{len(ref)} rows vs {len(new)}")
    for i, (a, b) in enumerate(zip(ref, new)):
        keys = sorted({k for k in (*a, *b) if not wall_clock(k)})
        for k in keys:
            if k not in a or k not in b:
                out.append(f"row {i} ({a.get('step')}): {k} only in {'ref' if k in a else 'new'}")
            elif a[k] != b[k] and not (isinstance(a[k], (int, float)) and isinstance(b[k], (int, float))
                                       and abs(a[k] - b[k]) <= tol):
                out.append(f"row {i} (step {a.get('step')}): {k} {a[k]!r} != {b[k]!r}")
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    tol = 0.0
    if "--tol" in args:
        i = args.index("--tol")
        tol = float(args[i + 1])
        del args[i:i + 2]
    diff = differences(rows(args[0]), rows(args[1]), tol)
    print("\n".join(diff) if diff else f"equal ({len(rows(args[0]))} rows, wall-clock keys ignored)")
    sys.exit(1 if diff else 0)
