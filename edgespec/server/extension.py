"""The ``edgespec`` field of streamed chunks: where each piece of text came from, and what each round did.

OpenAI's clients keep fields they do not know as extras and otherwise ignore them, so this rides every streamed
chunk without changing the shapes they parse. The chat page (:mod:`edgespec.server.page`) colours text by
``origin`` and draws the rounds; any other client may read it too::

    "edgespec": {
      "spans": [{"text": "def", "origin": "draft"}, ...],   # the chunk's text split by origin, in order
      "rounds": [{"drafter": "model", "drafted": 2, "accepted": 1, "t": 0.41}, ...],  # rounds since the last chunk
      "live": {"generated": 12, "tokens_per_second": 31.2, "acceptance_rate": 0.6, "tokens_per_verify": 1.9,
               "drafter": "model", "draft_len": 2, "decision": "..."}
    }

``origin`` is ``"draft"`` (a draft model's token the target accepted), ``"lookup"`` (a prompt-lookup token the
target accepted), ``"cache"`` (a token copied from an earlier reply by the suffix cache, accepted) or ``"target"``
(sampled by the target: a correction, a bonus token, plain decoding). A round's ``t`` is seconds since the request
started. The finishing chunk adds ``"summary"``: the reply's speedup estimate against plain decoding
(:func:`edgespec.chat.session.speedup`, the TUI's number) and the plain rate it divides by.
"""

from __future__ import annotations

from edgespec.chat.session import speedup
from edgespec.events import Chunk, Span, Stats

ORIGINS = ("draft", "lookup", "cache", "target")


def origin(span: Span, drafter: str) -> str:
    """Where a span's token came from: a drafted token takes the name of its round's drafter."""
    if not span.from_draft:
        return "target"
    return drafter if drafter in ("lookup", "cache") else "draft"


def live(stats: Stats) -> dict:
    return {
        "generated": stats.generated,
        "tokens_per_second": round(stats.tokens_per_second, 3),
        "acceptance_rate": round(stats.acceptance_rate, 4),
        "tokens_per_verify": round(stats.tokens_per_verify, 4),
        "drafter": stats.drafter,
        "draft_len": stats.draft_len,
        "decision": stats.decision,
    }


def summary(stats: Stats) -> dict:
    gain = speedup(stats)
    return {
        "speedup": round(gain, 4) if gain is not None else None,
        "plain_tokens_per_second": round(stats.plain_tokens_per_second, 3),
        "busy_seconds": round(stats.t_draft + stats.t_verify + stats.t_sample, 4),
    }


class RoundLog:
    """Follows one request's chunks and hands each streamed frame its ``edgespec`` field.

    Every chunk is observed, also those with no text yet (a held-back UTF-8 character or stop-string prefix):
    their rounds ride the next frame that is sent, so the page sees every round exactly once.
    """

    def __init__(self) -> None:
        self._last = Stats()
        self._rounds: list[dict] = []

    def observe(self, chunk: Chunk) -> None:
        stats, last = chunk.stats, self._last
        if stats.rounds > last.rounds:  # a round's chunk (a text stream's tail repeats the last round's stats)
            self._rounds.append(
                {
                    "drafter": stats.drafter,
                    "drafted": stats.drafted - last.drafted,
                    "accepted": stats.accepted - last.accepted,
                    "t": round(stats.t_total, 4),
                }
            )
        self._last = stats

    def frame(self, chunk: Chunk | None) -> dict:
        """The field for the frame that carries ``chunk``'s text (None: the finishing frame, no text)."""
        spans = []
        if chunk is not None:
            for span in chunk.spans:
                kind = origin(span, chunk.stats.drafter)
                if spans and spans[-1]["origin"] == kind:
                    spans[-1]["text"] += span.text
                else:
                    spans.append({"text": span.text, "origin": kind})
        rounds, self._rounds = self._rounds, []
        return {"spans": spans, "rounds": rounds, "live": live(self._last)}

    def finish(self, stats: Stats) -> dict:
        """The finishing frame's field: the rounds not yet sent, the final numbers and the summary."""
        self._last = stats
        return {**self.frame(None), "summary": summary(stats)}
