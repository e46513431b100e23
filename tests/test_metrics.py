"""pass@k / pass^k against brute-force enumeration of k-subsets."""
import itertools
import math

import pytest

from agentrl_cli import metrics


def _brute(n, c, k):
    """(fraction of k-subsets with >= 1 correct, fraction with all correct)."""
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    any_ok = sum(1 for s in subsets if any(outcomes[i] for i in s))
    all_ok = sum(1 for s in subsets if all(outcomes[i] for i in s))
    return any_ok / len(subsets), all_ok / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_and_hat_vs_enumeration(n):
    for c in range(0, n + 1):
        for k in range(1, n + 1):
            want_at, want_hat = _brute(n, c, k)
            assert metrics.pass_at_k(n, c, k) == pytest.approx(want_at, abs=1e-12)
            assert metrics.pass_hat_k(n, c, k) == pytest.approx(want_hat, abs=1e-12)


def test_pass_at_k_closed_form_and_edges():
    assert metrics.pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert metrics.pass_at_k(10, 0, 5) == 0.0
    assert metrics.pass_at_k(10, 10, 1) == 1.0
    assert metrics.pass_at_k(5, 2, 4) == 1.0  # n - c = 3 < k
    assert metrics.pass_at_k(100, 7, 10) == pytest.approx(1 - math.comb(93, 10) / math.comb(100, 10))
    assert metrics.pass_hat_k(10, 3, 2) == pytest.approx(3 / 45)


@pytest.mark.parametrize("n", range(1, 9))
def test_monotone_in_k(n):
    for c in range(0, n + 1):
        at = [metrics.pass_at_k(n, c, k) for k in range(1, n + 1)]
        hat = [metrics.pass_hat_k(n, c, k) for k in range(1, n + 1)]
        assert all(a <= b + 1e-12 for a, b in zip(at, at[1:]))
        assert all(a >= b - 1e-12 for a, b in zip(hat, hat[1:]))
        assert at[0] == pytest.approx(hat[0]) == pytest.approx(c / n)


@pytest.mark.parametrize("fn", [metrics.pass_at_k, metrics.pass_hat_k])
def test_invalid_arguments(fn):
    with pytest.raises(ValueError):
        fn(4, 2, 5)
    with pytest.raises(ValueError):
        fn(4, 5, 2)
    with pytest.raises(ValueError):
        fn(4, -1, 2)


def test_aggregate_pass():
    out = metrics.aggregate_pass([(4, 1), (4, 4), (4, 0)], ks=[1, 2])
    assert out["pass@1"] == pytest.approx((0.25 + 1 + 0) / 3)
    assert out["pass@2"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert out["pass^2"] == pytest.approx((0 + 1 + 0) / 3)
    with pytest.raises(ValueError):
        metrics.aggregate_pass([(2, 1)], ks=[3])
    with pytest.raises(ValueError):
        metrics.aggregate_pass([], ks=[1])
