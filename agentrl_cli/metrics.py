"""Evaluation metrics of the pass@k family (docs/methods.md).

For one task, `n` answers were sampled and `c` of them were correct.

- `pass_at_k(n, c, k)`: probability that at least one of `k` answers drawn without replacement
  from the `n` is correct, `1 - C(n-c, k) / C(n, k)` — the unbiased estimator of pass@k.
- `pass_hat_k(n, c, k)`: probability that all `k` drawn answers are correct, `C(c, k) / C(n, k)`
  (pass^k, the "reliability" metric).

`aggregate_pass` averages both over tasks.
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
