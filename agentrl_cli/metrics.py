"""Evaluation metrics of the pass@k family (docs/methods.md).

For one task, `n` answers were sampled and `c` of them were correct.

- `pass_at_k(n, c, k)`: probability that at least one of `k` answers drawn without replacement
  from the `n` is correct, `1 - C(n-c, k) / C(n, k)` — the unbiased estimator of pass@k.
- `pass_hat_k(n, c, k)`: probability that all `k` drawn answers are correct, `C(c, k) / C(n, k)`
  (pass^k, the "reliability" metric).

`aggregate_pass` averages both over tasks.

Also the rank statistics of the critic diagnostics: `ranks` (tie-averaged) and `spearman`.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence


def _check(n: int, c: int, k: int) -> None:
    if n < 0 or c < 0 or k < 0:
        raise ValueError(f"n, c, k must be non-negative, got n={n}, c={c}, k={k}")
    if c > n:
        raise ValueError(f"more correct answers than samples: c={c} > n={n}")
    if k > n:
        raise ValueError(f"k={k} exceeds the number of samples n={n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k, `1 - C(n-c, k) / C(n, k)`.

    Computed as `1 - prod_{i=n-c+1}^{n} (1 - k / i)` (numerically stable, no big binomials),
    and exactly 1.0 when `n - c < k` (every k-subset contains a correct answer).
    Raises ValueError when `k > n`, `c > n` or an argument is negative. `k = 0` gives 0.0.
    """
    _check(n, c, k)
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k = `C(c, k) / C(n, k)`: all k answers drawn without replacement are correct.

    Raises ValueError when `k > n`, `c > n` or an argument is negative. `k = 0` gives 1.0.
    """
    _check(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


def aggregate_pass(counts: Sequence[tuple[int, int]], ks: Iterable[int]) -> dict[str, float]:
    """Average pass@k and pass^k over tasks.

    `counts` holds one `(n, c)` pair per task. Returns `{"pass@k": ..., "pass^k": ...}` for every
    k in `ks` (plain means over tasks, every task weighted equally). Every task must have
    `n >= k` (ValueError otherwise); an empty `counts` raises ValueError too.
    """
    counts = list(counts)
    if not counts:
        raise ValueError("aggregate_pass needs at least one task")
    out: dict[str, float] = {}
    for k in ks:
        out[f"pass@{k}"] = sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)
        out[f"pass^{k}"] = sum(pass_hat_k(n, c, k) for n, c in counts) / len(counts)
    return out


def ranks(x: Sequence[float]) -> list[float]:
    """1-based ranks, ties get the mean of the ranks they span."""
    order = sorted(range(len(x)), key=lambda i: x[i])
    r = [0.0] * len(x)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rho: the Pearson correlation of the (tie-averaged) ranks; None when either
    side is constant or there are fewer than 2 points (undefined)."""
    if len(x) != len(y):
        raise ValueError("x and y must have the same length")
    if len(x) < 2:
        return None
    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)
