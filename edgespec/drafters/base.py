"""The drafter protocol: propose tokens, then learn which tokens were committed.

A drafter never decides what is accepted; the verifier does. A drafter that samples (a draft model at
temperature > 0) returns the distributions ``q`` it sampled from, so the verifier can accept with min(1, p/q).
A deterministic drafter (prompt lookup) returns ``q=None``: its q is one-hot on the proposed token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from edgespec.sampling import SamplingParams, Uniforms
from edgespec.warp import Dist

FORCED = "forced"  # the "drafter" of the tokens a constraint forces: proposed without drafting, surely accepted


@dataclass(frozen=True)
class Draft:
    tokens: list[int]  # d_1 .. d_γ' (γ' <= the γ asked for; may be empty: "nothing to propose")
    q: list[Dist] | None  # q_1 .. q_γ' the tokens were sampled from; None for a deterministic drafter

    @staticmethod
    def empty() -> Draft:
        return Draft([], None)


class Drafter(Protocol):
    name: str  # short identifier shown in stats: "model", "lookup"

    def reset(self, context: Sequence[int]) -> None:
        """A new request starts; ``context`` is its prompt (it may share a prefix with the last request)."""

    def propose(
        self, context: Sequence[int], max_len: int, params: SamplingParams, rng: Uniforms
    ) -> Draft:
        """Propose up to ``max_len`` tokens to follow ``context`` (all committed tokens so far)."""

    def commit(self, context: Sequence[int]) -> None:
        """A round ended and ``context`` is now committed. Called on every drafter after every round, whether it
        proposed or not: a KV-holding drafter drops what it computed beyond the committed prefix (rollback), an
        indexing drafter indexes the new tokens."""
