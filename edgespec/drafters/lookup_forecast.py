"""How many of prompt lookup's proposed tokens the target will accept, learned from every round for free.

Prompt lookup is deterministic and costs nothing to ask, so its proposal can be made every round — also in the
rounds that do not draft with it — and checked against the tokens the target then commits. Where the target
decodes greedily, a drafted token is accepted exactly when it equals the token committed at its place; where it
samples, a one-hot draft ``d`` is accepted with probability p(d), the probability that the committed token is
``d``. Either way, "the committed tokens began with the proposal's first k tokens" is an unbiased sample of "a
draft of k would have been accepted in full", whatever the round actually did. So lookup needs no exploration
rounds, and choosing plain decoding costs it no information.

What a proposal's chance depends on is how firmly it is anchored. Lookup finds the proposal by the text's last
n-gram; the *agreement* is how many tokens before that n-gram also agree with the text before its earlier
occurrence (:attr:`~edgespec.drafters.lookup.LookupDrafter.last_agreement`). Where the output copies a span of the
input, the agreement grows with the copy and the proposal is right for as long as the copy goes on; a match
with no agreement beyond its n-gram is a guess. The state is the agreement in logarithmic buckets (0, 1, 2-3,
4-7, ...). (It replaced the *run*, how many committed tokens in a row the proposals predicted: on recorded Qwen
generations the agreement tells a copy's length better, because it sees the copied text before the first
proposal into it is checked; replayed at the dev CPU's decode costs, code edits went from 46 % to 53 % of the
lookup ceiling's gain and summaries from 43 % to 51 %, creative text and code generation stayed within 1 % of
plain.)

Per state it keeps the *hazard* ``h(k) = P(token k right | tokens 1..k-1 right)`` for k = 1..max_len, from counts
that fade with every committed token (so they describe the last ~50 tokens of text, not the session). A
proposal's token k is counted as soon as the k-th token after it is committed, not when the whole proposal is
settled: a right 16-token proposal would otherwise say nothing for 16 tokens, the very stretch of a copy where
drafting pays. The survival ``S(k) = h(1)···h(k)``, the chance that a draft of k is accepted in full, then
assumes no independence between positions: in a copy h rises with k, in prose it falls. Before a state has
evidence, its hazard follows the rule of succession: after ``a + k - 1`` agreeing tokens (``a`` before the match,
``k - 1`` proposed ones), the next agrees with probability ``(a + k) / (a + k + f)``, ``f`` pseudo-failures making it
cautious (on a CPU a wrong long draft costs several decode steps for one token).

(Each bucket learns from its own evidence alone. Lifting a bucket's hazards to those of the lower buckets, from
agreement 2 up, took code edits from 48 % to 54 % of the lookup ceiling before the coverage below existed; beside
it, removing the lift moved no class by more than the replay's spread: docs/benchmarks.md.)

A reply that is copying its prompt says so before the agreement does. An edit breaks the copy at every changed
token, and where the copy resumes, the text just before the match differs from the source (the edit is there), so
the agreement starts again from 0 while the copy goes on as before. What tells these restarts from coincidences is
the *coverage*, the share of the last ~30 committed tokens that lookup's proposals predicted (high in a reply that
copies, low elsewhere), together with where the match comes from: an n-gram that occurred once before, in the
prompt (:attr:`~edgespec.drafters.lookup.LookupDrafter.last_from_prompt`). In recorded Qwen code edits such
proposals at agreement 0-3 were right for 8-13 tokens on average where the coverage was at least 0.5, other matches
there for 1.4; in answers that copy little the coverage rarely reached 0.5. So while the coverage is at least
``copying_coverage``, a proposal from the prompt counts as anchored by at least ``copy_agreement`` tokens
(and shares that bucket's evidence). (Waiting for a token to be written after a proposal missed before counting one
as a copy, for the case where the reply has just left the copy at an inserted line, moved no class beyond the
replay's spread: docs/benchmarks.md.) Replayed at ten decode cost curves (eight measured on 2-core dev CPUs,
the H200's, the CPU profile), auto's share of the lookup ceiling went, averaged over the curves, from 50 % to 52 %
on the bench's code edits (higher at eight curves, lower at one), from 47 % to 58 % on the untuned ones (higher at
nine), from 48 % to 53 % on eight code edits written afterwards to check it (higher at nine;
tests/data/validation-code-edits.toml, which then also decided between 0.6 and 0.7 below), held-out edits 61 % ->
62 %, summaries 53 % -> 54 %; the answers that copy little replayed at unchanged speeds at every curve.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from edgespec.drafters.lookup import AGREEMENT_CAP


@dataclass(frozen=True)
class ForecastConfig:
    """The forecast's tuned numbers (chosen by replaying recorded generations: see the module docstring and
    docs/benchmarks.md)."""

    decay: float = 0.98  # evidence kept per committed token: the hazards describe the last ~50 tokens of text
    prior_weight: float = 2.0  # observations the rule-of-succession prior counts for
    prior_failures: float = 2.0  # its f: pseudo-failures that make a bare match cautious
    # A reply copying its prompt: while lookup predicted at least this share of the recent committed tokens, a
    # proposal from the prompt counts as anchored by copy_agreement tokens at least (chosen among 0.5-0.8 and 2-16:
    # at 0.5 summaries drafted where they lost, at 0.7 the new edits gained 1 point where 0.6 gained 5).
    copying_coverage: float = 0.6
    copy_agreement: int = 8  # the agreement such a proposal counts for
    coverage_fade: float = 0.97  # per committed token: the coverage describes the last ~30 tokens
    # Committed tokens (faded) of this request before the coverage says anything: with 4, a math answer that
    # restated its question drafted 15 tokens at a restart and lost 2.6 % at one curve.
    coverage_least: float = 16.0


DEFAULT_FORECAST = ForecastConfig()


def agreement_bucket(agreement: int) -> int:
    """0 for none, else 1 + floor(log2(agreement)): agreements of 1, 2-3, 4-7, 8-15, ... share evidence."""
    return agreement.bit_length()


@dataclass
class _Pending:
    """A proposal still being checked against the committed tokens."""

    bucket: int
    tokens: list[int]
    matched: int = 0


class LookupForecast:
    """Survival of prompt lookup's proposals by agreement, from proposals checked against committed tokens.

    Per round: :meth:`offer` the proposal (before the plan), :meth:`survival` for the plan, then :meth:`commit`
    the tokens the round committed. ``config``: the tuned numbers (:class:`ForecastConfig`).
    """

    def __init__(self, max_len: int, config: ForecastConfig = DEFAULT_FORECAST, max_agreement: int = AGREEMENT_CAP):
        if max_len < 1:
            raise ValueError("max_len must be >= 1")
        self.max_len = max_len
        self.config = config
        self.decay = config.decay
        self.prior_weight = config.prior_weight
        self.max_agreement = max_agreement
        self._bucket = 0  # the current proposal's agreement_bucket
        self._offer: list[int] = []
        self._survival: list[float] = []  # the current proposal's S(k), as far as worked out (see survival)
        self._predicted = 0.0  # faded count of this request's committed tokens that the proposal before them predicted
        self._committed = 0.0  # faded count of this request's committed tokens
        self._pending: list[_Pending] = []
        n_buckets = agreement_bucket(max_agreement) + 1
        # Counts in plain lists (this runs every round, right after a decode, where each numpy call is dear) and
        # kept divided by _scale, the fade of everything committed so far: fading is one multiplication, not one
        # per count.
        self._trials = [[0.0] * max_len for _ in range(n_buckets)]  # [bucket][k-1]: proposals tested at position k
        self._hits = [[0.0] * max_len for _ in range(n_buckets)]  # of those, right at position k
        self._scale = 1.0
        low_ends = [0] + [1 << (b - 1) for b in range(1, n_buckets)]  # the least agreement of each bucket
        f = config.prior_failures
        self._prior = [[(low + k) / (low + k + f) for k in range(1, max_len + 1)] for low in low_ends]

    # ----- per round ---------------------------------------------------------------------------------------
    def offer(self, tokens: Sequence[int], agreement: int = 0, from_prompt: bool = False) -> None:
        """The lookup proposal at the current position (empty if it found none), its ``agreement``, and whether its
        n-gram occurred once before, in the prompt (``from_prompt``)."""
        self._offer = [int(t) for t in tokens[: self.max_len]]
        self._survival = []
        config = self.config
        if from_prompt and self.coverage >= config.copying_coverage:
            agreement = max(agreement, config.copy_agreement)  # a copy going on past an edit
        self._bucket = agreement_bucket(min(max(agreement, 0), self.max_agreement))
        if self._offer:
            self._pending.append(_Pending(self._bucket, self._offer))

    @property
    def offered(self) -> tuple[int, int]:
        """The current proposal's (agreement bucket, length): (-1, 0) for none."""
        return (self._bucket, len(self._offer)) if self._offer else (-1, 0)

    def survival(self, length: int) -> list[float]:
        """``S[k-1]``: estimated chance that the current proposal's first k tokens are all accepted, k ≤ length."""
        length = min(length, len(self._offer))
        # A round asks for it several times (the offer, the plan, lockstep): worked out once per proposal and
        # evidence, as far as asked for so far.
        known = self._survival
        if len(known) < length:
            known = self._survival = list(accumulate(self.hazard(self._bucket, length), operator.mul))
        return known[:length]

    def commit(self, tokens: Sequence[int]) -> None:
        """The tokens the round committed, in order: they settle (part of) the pending proposals."""
        committed = [int(t) for t in tokens]
        if not committed:
            return
        self._count_coverage(committed)
        self._offer = []
        self._survival = []
        self._scale *= self.decay ** len(committed)
        if self._scale < 1e-100:  # fold the fade into the counts before 1 / scale overflows
            for rows in (self._trials, self._hits):
                for row in rows:
                    row[:] = [c * self._scale for c in row]
            self._scale = 1.0
        one = 1.0 / self._scale  # a count of 1 now, in the stored (unfaded) units
        still: list[_Pending] = []
        for p in self._pending:
            trials, hits = self._trials[p.bucket], self._hits[p.bucket]
            for tok in committed:  # position matched + 1 of the proposal is settled by this token
                trials[p.matched] += one
                if p.tokens[p.matched] != tok:
                    break
                hits[p.matched] += one
                p.matched += 1
                if p.matched == len(p.tokens):
                    break
            else:
                still.append(p)  # right so far, with tokens left to check
        self._pending = still

    def reset(self) -> None:
        """A new request: pending proposals are about a text that will not continue, and so is the coverage; the
        evidence stays."""
        self._pending.clear()
        self._offer = []
        self._survival = []
        self._predicted = self._committed = 0.0

    @property
    def coverage(self) -> float:
        """The share of this request's recent committed tokens (fading by ``coverage_fade`` a token) that the
        proposal offered before them predicted; 0 until ``coverage_least`` of them."""
        return self._predicted / self._committed if self._committed >= self.config.coverage_least else 0.0

    def _count_coverage(self, committed: list[int]) -> None:
        offer, n = self._offer, len(committed)
        predicted = 0
        while predicted < min(len(offer), n) and offer[predicted] == committed[predicted]:
            predicted += 1
        fade = self.config.coverage_fade
        if n == 1:  # most rounds (every plain one): the sums below, in one step
            self._predicted = self._predicted * fade + predicted
            self._committed = self._committed * fade + 1.0
        else:
            # Oldest first: the i-th of the n committed tokens has faded n - 1 - i times by the end of the round.
            self._predicted = self._predicted * fade**n + sum(fade ** (n - 1 - i) for i in range(predicted))
            self._committed = self._committed * fade**n + sum(fade**i for i in range(n))

    # ----- estimates ---------------------------------------------------------------------------------------
    def hazard(self, bucket: int, length: int | None = None) -> list[float]:
        """``h[k-1]`` = P(token k of a proposal made in agreement bucket ``bucket`` is right | tokens before k were),
        for k up to ``length`` (all by default), from the bucket's evidence and prior."""
        n = self.max_len if length is None else length
        w, scale = self.prior_weight, self._scale
        return [
            (hits * scale + w * prior) / (trials * scale + w)
            for hits, trials, prior in zip(
                self._hits[bucket][:n], self._trials[bucket][:n], self._prior[bucket][:n], strict=True
            )
        ]
