"""What a KV slot offers the engine: the typed seam between the engine's loop and a loaded model.

A lane of the engine talks to one sequence of each model (``lane.target``, ``lane.draft``): a
:class:`~edgespec.models.backend.Slot`, or for a lone lane the :class:`~edgespec.models.backend.Model` itself, which
speaks for its sequence 0. :class:`KVSlot` is what the engine, a lane and the drafters ask of it; :class:`KVModel`
adds what the engine asks of the model that holds the sequences (its slots, decodes of several of them at once).
The test fakes (``tests/fakes.py``) and :mod:`edgespec.replay`'s stand-ins offer the same, so the engine reads
every member as an attribute, with no fallback for a stand-in that lacks one.

:func:`sync` and :func:`common_prefix` work on any slot, through its verbs alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

if TYPE_CHECKING:
    from edgespec.sampling import Readout, Scores

# Rows one decode may score: the widest verify (γ ≤ 64, plus the pending token). llama.cpp sizes its output
# buffers and, with a backend sampler, one sampling subgraph per row by this, so it is not left at n_batch.
MAX_ROWS = 65


@runtime_checkable
class KVSlot(Protocol):
    """One sequence of a model's KV cache, its verbs, and the model's facts read through it."""

    # ----- the sequence ---------------------------------------------------------------------------------------
    @property
    def kv_tokens(self) -> list[int]:
        """The tokens the sequence's KV holds at positions 0..len-1 (the engine's bookkeeping mirrors llama.cpp's).
        Read it; only the slot's own verbs change it."""
        ...

    def decode(self, tokens: Sequence[int], rows: Sequence[int] = (), readout: Readout = ...) -> Scores:
        """Append ``tokens`` to the KV (at positions ``len(kv_tokens)..``) and score the rows asked for: ``rows``
        are ascending indices into ``tokens`` (at most :attr:`max_verify_rows` of them for a verify), and
        ``readout`` (default: whole logits rows) says what comes back for each (:class:`~edgespec.sampling.Readout`).
        A decode that fails leaves the KV as it was."""
        ...

    def truncate(self, n_keep: int) -> None:
        """Roll back: drop the KV at positions >= ``n_keep``. A memory that cannot drop part of a sequence
        (recurrent models) drops all of it: read :attr:`kv_tokens` after."""
        ...

    def sync(self, tokens: Sequence[int]) -> int:
        """Make the KV hold ``tokens`` exactly, reusing the longest common prefix; returns the tokens decoded
        (:func:`sync`)."""
        ...

    # ----- the model's, read through the sequence ------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        """Tokens in the vocabulary: the width of a logits row."""
        ...

    @property
    def n_ctx(self) -> int:
        """Positions the sequence's KV holds at most."""
        ...

    @property
    def n_batch(self) -> int:
        """Tokens llama.cpp takes in one forward pass; a longer decode runs as several."""
        ...

    @property
    def n_seq(self) -> int:
        """Sequences the model was loaded with (1 unless loaded for parallel requests)."""
        ...

    @property
    def max_verify_rows(self) -> int:
        """The most rows one decode scores: :data:`MAX_ROWS`, or fewer for a bit-exact model."""
        ...

    @property
    def bit_exact(self) -> bool:
        """Whether every row of a batch rounds as a single-token decode does (greedy speculation is then
        token-identical to plain decoding)."""
        ...

    @property
    def busy_seconds(self) -> float:
        """Wall time spent inside llama.cpp's decodes so far (what the Python loop cannot speed up)."""
        ...

    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends a generation (end of turn, end of text)."""
        ...

    def token_text(self, token: int) -> str:
        """The vocabulary's text of ``token`` (control tokens included)."""
        ...

    def piece(self, token: int) -> bytes:
        """The bytes ``token`` stands for in output (may be part of a UTF-8 character; control tokens b"")."""
        ...

    def readout_path(self, readout: Readout) -> str:
        """Where sampling for ``readout`` runs on this model, for the stats."""
        ...


class Part(NamedTuple):
    """One sequence's share of a decode: its tokens, the indices of those to score, and how to read their rows."""

    slot: Any  # the sequence (a KVSlot)
    tokens: Sequence[int]
    rows: Sequence[int]
    readout: Readout

    def decode(self) -> Scores:
        """This part alone, as a decode of its sequence."""
        return self.slot.decode(self.tokens, self.rows, self.readout)


@runtime_checkable
class KVModel(KVSlot, Protocol):
    """A model with its sequences: itself a :class:`KVSlot` (sequence 0), and the engine's way to decode several
    sequences at once."""

    @property
    def slots(self) -> Sequence[KVSlot]:
        """One slot per sequence, sequence 0 first."""
        ...

    def decode_batch(self, parts: Sequence[Part]) -> list[Scores]:
        """Several sequences' tokens in one decode: each part is ``(slot, tokens, rows, readout)`` as for
        :meth:`KVSlot.decode`, a slot of this model, each sequence at most once; the parts' scores, in order."""
        ...

    def decode_passes(self, tokens_by_seq: Mapping[int, int]) -> list[int]:
        """The token counts of the forward passes one :meth:`decode_batch` of ``tokens_by_seq[s]`` tokens of each
        sequence ``s`` runs (see :mod:`edgespec.models.microbatch`)."""
        ...


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def sync(kv: KVSlot, tokens: Sequence[int]) -> int:
    """Make ``kv``'s cache (a model's sequence 0, a slot, or a stand-in with their verbs) hold ``tokens`` exactly,
    reusing the longest common prefix. Returns the number of tokens decoded."""
    common = common_prefix(kv.kv_tokens, tokens)
    kv.truncate(common)
    rest = tokens[common:]
    if rest:
        kv.decode(rest)
    return len(rest)
