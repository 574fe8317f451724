"""The online estimates a :class:`~edgespec.drafters.controller.Controller` plans with, and the round model they feed.

The model of one round that drafts γ tokens with drafter ``d``:

* every drafted position is accepted independently with probability α_d until the first rejection, so the
  round commits ``E[tokens] = (1 - α^(γ+1)) / (1 - α)`` tokens (the accepted drafts plus the target's own:
  :func:`expected_tokens`);
* it costs ``γ · c_d`` of drafting plus one target decode of ``b = γ + 1`` tokens, ``c_v(b)``.

Plain decoding is the round with γ = 0: one token for ``c_v(1)``. All of α_d (:class:`Acceptance`), c_d
(:class:`DecayedRatio`) and the curve c_v(b) (:class:`VerifyCost`) are measured online with exponentially decayed
averages, so the choice follows the text (code vs prose) and the machine (a wide verify costs nearly a single step
per row on a CPU and far less on a GPU: docs/benchmarks.md).
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Sequence


def expected_tokens(alpha: float, gamma: int) -> float:
    """E[tokens committed] by a round drafting γ tokens at per-position acceptance α (γ=0: exactly 1)."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


class DecayedRatio:
    """Σ amounts / Σ counts with both sums decayed per update: a mean that forgets old samples geometrically.

    As a ratio of sums it weighs samples by their count (a round of 6 drafted tokens says more about the
    per-token cost than a round of 1) and tolerates zero-count samples (time spent for nothing).
    """

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self._amount = 0.0
        self._count = 0.0

    def add(self, amount: float, count: float = 1.0) -> None:
        self._amount = self._amount * self.decay + amount
        self._count = self._count * self.decay + count

    @property
    def value(self) -> float | None:
        return self._amount / self._count if self._count > 1e-9 else None


class Acceptance:
    """Per-position acceptance probability α: decayed successes / trials, plus a weak prior.

    A round that drafted n and accepted k observed k successes and, if k < n, one failure; positions after the
    first rejection were never tested. The decay is per observed position, so a long draft and a short one
    age the estimate by what they showed.
    """

    def __init__(self, prior: float, prior_weight: float, decay: float) -> None:
        self.prior = prior
        self.prior_weight = prior_weight
        self.decay = decay
        self._accepted = 0.0
        self._rejected = 0.0

    def forget(self, factor: float) -> None:
        """Age the evidence without new observations (so it drifts back toward the prior)."""
        self._accepted *= factor
        self._rejected *= factor

    def update(self, n_drafted: int, n_accepted: int) -> None:
        rejected = 1 if n_accepted < n_drafted else 0
        age = self.decay ** (n_accepted + rejected)
        self._accepted = self._accepted * age + n_accepted
        self._rejected = self._rejected * age + rejected

    @property
    def alpha(self) -> float:
        total = self._accepted + self._rejected + self.prior_weight
        return (self._accepted + self.prior * self.prior_weight) / total


class VerifyCost:
    """The target's cost of one decode of b tokens, c_v(b), from decayed per-b means.

    An unseen b is read off the seen ones: interpolated between neighbours, extrapolated beyond the widest
    with the least-squares slope (clamped >= 0), or, with only one width seen, from ``slope_prior``
    (c_v(b) = c_v(1)·(1 + slope_prior·(b-1)), about what a CPU shows). Unseen widths are then made
    ``optimism`` cheaper so that each gets tried once instead of being ruled out by a fit it might beat (a
    CPU's 4-token decode is cheaper than its 3-token one).
    """

    def __init__(self, decay: float, slope_prior: float, optimism: float) -> None:
        self.decay = decay
        self.slope_prior = slope_prior
        self.optimism = optimism
        self._by_b: dict[int, DecayedRatio] = {}
        # What the curve is worked out from, kept up to date by add: each width's estimate, and the widths in order.
        self._values: dict[int, float] = {}
        self._widths: list[int] = []
        self._sums = [0.0, 0.0, 0.0, 0.0]  # of b, c, b*b and b*c over the measured widths: the fit's slope in O(1)
        # Cached. A round's add changes one measured width: where every width of the cached curve is measured, that
        # entry is updated in place; otherwise (widths read off the fit) the curve is worked out again.
        self._curve: list[float] | None = None
        self._curve_all_measured = False
        self.switch = 0.0  # extra seconds of a decode whose width differs from the previous one's (a new graph)
        self._last_b: int | None = None  # the width of the last decode added

    def forget(self) -> None:
        """Drop every width's measurements (and the curve worked out from them): a calibration replaces them."""
        self._by_b.clear()
        self._values.clear()
        self._widths.clear()
        self._sums = [0.0, 0.0, 0.0, 0.0]
        self._curve = None
        self._curve_all_measured = False
        self._last_b = None

    def add(self, b: int, seconds: float, *, calibrated: bool = False) -> None:
        """A decode of ``b`` rows took ``seconds``: a round's, right after the last one added, or (``calibrated``) one
        of a calibration's repeated decodes of one width, which reused their graph."""
        if not calibrated:
            if b != self._last_b and self._last_b is not None:
                # The curve is of decodes that reuse the last graph; a change of width is priced apart (``switch``),
                # so it comes off here, or plans would count it twice.
                seconds = max(seconds - self.switch, 0.0)
            self._last_b = b
        est = self._by_b.setdefault(b, DecayedRatio(self.decay))
        est.add(seconds)
        value = est.value
        assert value is not None  # a sample was just added
        before = self._values.get(b)
        if before is None:
            insort(self._widths, b)
            before = 0.0
            self._sums[0] += b
            self._sums[2] += b * b
        self._values[b] = value
        self._sums[1] += value - before
        self._sums[3] += b * (value - before)
        curve = self._curve
        if curve is not None and self._curve_all_measured and b < len(curve):
            # What working it out again would give (a new list: a plan may still hold the last one).
            self._curve = curve = curve.copy()
            curve[b] = value
        else:
            self._curve = None

    def add_decode(self, passes: Sequence[int], seconds: float) -> None:
        """A decode that llama.cpp ran as these forward passes (their widths) took ``seconds``: a sample of its
        widest pass, the time less what the other passes are estimated to cost.

        Plans price a decode as the sum of its passes, and choose the width that looks cheapest: left unsampled,
        a width that calibration read low stays the favourite for good. Under load a sequence's draft runs as a
        pass beside the others' single rows, so without this its width would only be measured alone, where it costs
        less than beside them, and long lookup drafts would keep being chosen at a loss."""
        if len(passes) == 1:
            self.add(passes[0], seconds)
            return
        widest = max(range(len(passes)), key=passes.__getitem__)
        others = [self.measured(b) for i, b in enumerate(passes) if i != widest]
        if any(c is None for c in others):
            return  # nothing to subtract yet
        rest = seconds - sum(c for c in others if c is not None)
        if rest > 0:
            self.add(passes[widest], rest)

    @property
    def last_width(self) -> int | None:
        """The width of the last decode added (the graph llama.cpp holds now), None before any."""
        return self._last_b

    def measured(self, b: int) -> float | None:
        return self._values.get(b)

    def curve(self, max_b: int) -> list[float] | None:
        """``[_, c_v(1), .., c_v(max_b)]`` (index 0 unused), or None before any measurement."""
        if self._curve is not None and len(self._curve) > max_b:
            return self._curve
        known, widths = self._values, self._widths
        if not widths:
            return None
        # Widths are positive and distinct, so 1..max_b are all measured when the max_b-th least is max_b.
        self._curve_all_measured = max_b < 1 or (len(widths) >= max_b and widths[max_b - 1] == max_b)
        if self._curve_all_measured:  # calibrated: every width measured (each round lands here)
            curve = [0.0, *(known[b] for b in range(1, max_b + 1))]
        else:
            # Worked out again after every decode under load (plans read widths past the calibrated ones), so in
            # one walk over the measured widths rather than a bisection for each: lockstep at several lanes reads
            # dozens of widths, and their cost adds up beside a GPU's step of a few milliseconds.
            slope = self._slope()
            keep = 1.0 - self.optimism
            curve = [0.0]
            i = 0  # widths[i]: the least measured width >= b
            if widths[-1] == len(widths):  # calibrated: 1..m measured, max_b past them (the walk ends at once)
                curve.extend(known[b] for b in widths)
                i = len(widths)
            for b in range(i + 1, max_b + 1):
                while i < len(widths) and widths[i] < b:
                    i += 1
                if i == len(widths):  # past the widest measured: the rest in one go
                    lo_b = widths[-1]
                    lo_c = known[lo_b]
                    curve.extend((lo_c + slope * (w - lo_b)) * keep for w in range(b, max_b + 1))
                    break
                hi_b = widths[i]
                hi_c = known[hi_b]
                if hi_b == b:
                    curve.append(hi_c)
                elif i > 0:
                    lo_b = widths[i - 1]
                    lo_c = known[lo_b]
                    curve.append((lo_c + (hi_c - lo_c) * (b - lo_b) / (hi_b - lo_b)) * keep)
                else:
                    curve.append(max(hi_c - slope * (hi_b - b), 0.25 * hi_c) * keep)
        self._curve = curve
        return curve

    def _slope(self) -> float:
        """The least-squares slope of the measured widths' costs (clamped >= 0), from the sums add keeps; with one
        width measured, the prior's."""
        n = len(self._widths)
        if n == 1:
            b0 = self._widths[0]
            return self.slope_prior * self._values[b0] / (1.0 + self.slope_prior * (b0 - 1))
        sum_b, sum_c, sum_bb, sum_bc = self._sums
        var = sum_bb - sum_b * sum_b / n
        return max((sum_bc - sum_b * sum_c / n) / var, 0.0)

