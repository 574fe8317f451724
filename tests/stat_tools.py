"""Goodness-of-fit helpers shared by the statistical tests (numpy and the standard library only)."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

# Every statistical test in this suite uses this false-alarm rate: an exact sampler fails it 1 time in 10,000.
ALPHA = 1e-4


def chi2_critical(df: int, alpha: float = ALPHA) -> float:
    """Upper ``alpha`` quantile of chi-square(df), Wilson–Hilferty approximation (good to ~1% for df >= 3; for df 1-2
    it overstates the cutoff by up to ~10%, which costs power, never false alarms)."""
    z = NormalDist().inv_cdf(1.0 - alpha)
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def chi2_gof(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> tuple[float, int]:
    """Chi-square statistic of observed ``counts`` against ``probs``, and its degrees of freedom.

    Cells of probability 0 are judged on their own: a single count in one is an impossible outcome and makes the
    statistic infinite (pooling it with rare cells would hide a leak of a few percent). Possible cells expected
    below ``min_expected`` are pooled into one (folded into the smallest cell when the pool too is below it), as the
    chi-square approximation needs.
    """
    counts = np.asarray(counts, dtype=float).ravel()
    probs = np.asarray(probs, dtype=float).ravel()
    impossible = probs <= 0
    if counts[impossible].any():
        return math.inf, max(int((~impossible).sum()) - 1, 1)
    counts, probs = counts[~impossible], probs[~impossible]
    n = counts.sum()
    expected = probs / probs.sum() * n
    big = expected >= min_expected
    obs = list(counts[big])
    exp = list(expected[big])
    if (~big).any():
        rest_obs, rest_exp = counts[~big].sum(), expected[~big].sum()
        if rest_exp >= min_expected or not exp:
            obs.append(rest_obs)
            exp.append(rest_exp)
        else:  # the pool is itself rare: fold it into the smallest cell, so that no cell is expected below 5
            j = int(np.argmin(exp))
            obs[j] += rest_obs
            exp[j] += rest_exp
    obs_a, exp_a = np.array(obs), np.array(exp)
    stat = float(((obs_a - exp_a) ** 2 / exp_a).sum())
    return stat, max(len(obs_a) - 1, 1)


def impossible_count(counts: np.ndarray, probs: np.ndarray) -> int:
    """How many observations fell in cells of probability 0."""
    counts, probs = np.asarray(counts).ravel(), np.asarray(probs).ravel()
    return int(counts[probs <= 0].sum())


def fits(counts: np.ndarray, probs: np.ndarray, alpha: float = ALPHA) -> tuple[bool, str]:
    stat, df = chi2_gof(counts, probs)
    crit = chi2_critical(df, alpha)
    return stat <= crit, f"chi2={stat:.1f} df={df} critical={crit:.1f} (alpha={alpha:.1e})"


class Check:
    """One goodness-of-fit check among several on the same samples: its χ², the critical value it is held to, and
    the ratio of the two (< 1 passes; a biased sampler's worst check should be far above 1)."""

    def __init__(self, name: str, counts: np.ndarray, probs: np.ndarray, alpha: float) -> None:
        self.name = name
        self.stat, self.df = chi2_gof(counts, probs)
        self.critical = chi2_critical(self.df, alpha)
        self.impossible = impossible_count(counts, probs)

    @property
    def ratio(self) -> float:
        return self.stat / self.critical

    def __repr__(self) -> str:
        leak = f", {self.impossible} impossible" if self.impossible else ""
        return f"{self.name}: chi2={self.stat:.1f} df={self.df} critical={self.critical:.1f}{leak}"


def family(checks: dict[str, tuple[np.ndarray, np.ndarray]], alpha: float = ALPHA) -> list[Check]:
    """Several checks on one set of samples, Bonferroni-corrected so that an exact sampler fails *any* of them
    with probability at most ``alpha``."""
    each = alpha / len(checks)
    return [Check(name, counts, probs, each) for name, (counts, probs) in checks.items()]


def worst(checks: list[Check]) -> Check:
    return max(checks, key=lambda c: c.ratio)
