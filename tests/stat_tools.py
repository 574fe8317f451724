"""Goodness-of-fit helpers shared by the statistical tests (numpy only)."""

from __future__ import annotations

import math

import numpy as np

# Every statistical test in this suite uses this false-alarm rate: an exact sampler fails it 1 time in 10,000.
ALPHA = 1e-4
_Z = {1e-4: 3.7190, 1e-3: 3.0902}


def chi2_critical(df: int, alpha: float = ALPHA) -> float:
    """Upper ``alpha`` quantile of chi-square(df), Wilson–Hilferty approximation (good to ~1% for df >= 3)."""
    z = _Z[alpha]
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def chi2_gof(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> tuple[float, int]:
    """Chi-square statistic of observed ``counts`` against ``probs``; cells expected < 5 are pooled into one."""
    counts = np.asarray(counts, dtype=float).ravel()
    probs = np.asarray(probs, dtype=float).ravel()
    n = counts.sum()
    expected = probs * n
    big = expected >= min_expected
    obs = list(counts[big])
    exp = list(expected[big])
    if (~big).any():
        obs.append(counts[~big].sum())
        exp.append(expected[~big].sum())
    obs_a, exp_a = np.array(obs), np.array(exp)
    keep = exp_a > 0
    if (obs_a[~keep] > 0).any():  # an impossible outcome was observed
        return math.inf, max(int(keep.sum()) - 1, 1)
    stat = float(((obs_a[keep] - exp_a[keep]) ** 2 / exp_a[keep]).sum())
    return stat, max(int(keep.sum()) - 1, 1)


def fits(counts: np.ndarray, probs: np.ndarray) -> tuple[bool, str]:
    stat, df = chi2_gof(counts, probs)
    crit = chi2_critical(df)
    return stat <= crit, f"chi2={stat:.1f} df={df} critical={crit:.1f} (alpha={ALPHA})"
