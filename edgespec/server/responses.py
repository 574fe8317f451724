"""OpenAI's response shapes, plus the two additions clients keep: ``timings`` (llama-server's names) and
``speculation`` (what drafting did for this request, and why it did nothing when it did nothing)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from edgespec.events import Stats, TokenLogprob
from edgespec.server.request import GenerationRequest, ToolUse
from edgespec.server.worker import Outcome
from edgespec.tools import ToolCall, parse_calls

# The engine's reasons, in OpenAI's words ("cancelled" only reaches a client that is gone).
FINISH_REASONS = {"stop": "stop", "eos": "stop", "length": "length", "cancelled": "stop"}


def reused_tokens(stats: Stats) -> int:
    """Prompt tokens whose KV an earlier request left (the engine prefills all but the prompt's last token, which
    opens the first round)."""
    return max(stats.prompt_tokens - 1 - stats.prefilled_tokens, 0)


def usage(stats: Stats) -> dict:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated,
        "total_tokens": stats.prompt_tokens + stats.generated,
        "prompt_tokens_details": {"cached_tokens": reused_tokens(stats)},
    }


def timings(stats: Stats) -> dict:
    """llama-server's ``timings``: prompt_* for the prompt tokens decoded (cache_n reused from the KV), predicted_*
    for the generation after it."""
    prompt_ms = stats.t_prefill * 1000.0
    predicted_ms = stats.t_decode * 1000.0
    cached = reused_tokens(stats)
    n_prompt, n_predicted = stats.prompt_tokens - cached, stats.generated
    return {
        "cache_n": cached,
        "prompt_n": n_prompt,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / n_prompt, 3) if n_prompt else 0.0,
        "prompt_per_second": round(n_prompt / stats.t_prefill, 3) if stats.t_prefill > 0 else 0.0,
        "predicted_n": n_predicted,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / n_predicted, 3) if n_predicted else 0.0,
        "predicted_per_second": round(stats.tokens_per_second, 3),
        "draft_n": stats.drafted,
        "draft_n_accepted": stats.accepted,
    }


def speculation(outcome: Outcome, request: GenerationRequest, draft_model: str | None) -> dict:
    """What speculation did; ``active: false`` with a ``reason`` when no round drafted."""
    stats = outcome.finished.stats
    hist = list(stats.accepted_per_round)
    while len(hist) > 1 and hist[-1] == 0:
        hist.pop()
    report = {
        "active": stats.drafted > 0,
        "drafters": list(outcome.drafters),
        "draft_model": draft_model,
        "lookup": request.lookup,
        "draft_len": request.draft_len,
        "acceptance_rate": round(stats.acceptance_rate, 4),
        "tokens_per_verify": round(stats.tokens_per_verify, 4),
        "rounds": stats.rounds,
        "draft_rounds": outcome.draft_rounds,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "accepted_per_round": hist,  # [k] = rounds that accepted k drafted tokens
        "forced": stats.forced,  # accepted tokens a constraint forced (drafted without a drafter)
        # free drafts by source: copied from the request's own text (prompt lookup), from earlier replies (the cache)
        "lookup_drafted": stats.lookup_drafted,
        "lookup_accepted": stats.lookup_accepted,
        "cache_drafted": stats.cache_drafted,
        "cache_accepted": stats.cache_accepted,
        "constraint_rereads": stats.rereads,  # constrained rows read again whole (too few allowed candidates)
    }
    if not report["active"]:
        report["reason"] = _why_inactive(request, draft_model)
    return report


def _why_inactive(request: GenerationRequest, draft_model: str | None) -> str:
    if request.draft_len == 0:
        return "draft_len is 0: speculation is off for this request"
    if draft_model is None and not request.lookup:
        return "no drafter: no draft model is loaded and prompt lookup is off"
    if request.draft_len == "auto":
        return "the controller decoded plainly every round: no draft promised to be faster on this machine"
    if draft_model is None:
        return "prompt lookup found nothing to propose"
    return "no round had room for a draft"


@dataclass(frozen=True)
class ResponseShape:
    """Builds the objects of one response, chat or text completion, streamed or whole."""

    kind: Literal["chat", "text"]
    model: str
    id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))
    piece: Callable[[int], bytes] | None = None  # a token's bytes, for log-probabilities' token texts

    def __post_init__(self) -> None:
        if not self.id:
            prefix = "chatcmpl" if self.kind == "chat" else "cmpl"
            object.__setattr__(self, "id", f"{prefix}-{uuid.uuid4().hex}")

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def complete(
        self,
        outcome: Outcome,
        extras: dict,
        *,
        logprobs: bool = False,
        echo: str | None = None,
        prompt: Sequence[int] = (),
        tools: ToolUse | None = None,
    ) -> dict:
        """The whole response of a non-streamed request (``logprobs``: the request asked for them; ``echo``: the
        prompt's text, which a text completion then starts with, the log-probabilities of its ``prompt`` tokens
        first)."""
        choices = []
        for index, finished in enumerate(outcome.choices):
            reason = FINISH_REASONS[finished.finish_reason]
            listed = self.logprobs(finished.logprobs) if logprobs else None
            if self.kind == "chat":
                message: dict = {"role": "assistant", "content": finished.text}
                parsed = parse_calls(tools.format, finished.text, tools.tools) if tools is not None else None
                if parsed is not None:  # a reply that is not a well-formed call stays text
                    message["content"], calls = parsed
                    message["tool_calls"] = [call.as_openai() for call in calls]
                    reason = "tool_calls" if reason == "stop" else reason
                choices.append({"index": index, "message": message, "logprobs": listed, "finish_reason": reason})
                continue
            text = finished.text
            if echo is not None:
                text = echo + text
                if listed is not None:
                    listed = self.echoed_logprobs(prompt, finished.prompt_logprobs, listed)
            choices.append({"index": index, "text": text, "logprobs": listed, "finish_reason": reason})
        head = self._head("chat.completion" if self.kind == "chat" else "text_completion")
        counted = usage(outcome.finished.stats)
        if outcome.others:  # one prompt, several completions
            extra = sum(f.stats.generated for f in outcome.others)
            counted["completion_tokens"] += extra
            counted["total_tokens"] += extra
        return {**head, "choices": choices, "usage": counted, **extras}

    def chunk(
        self,
        text: str | None,
        *,
        first: bool,
        finish_reason: str | None = None,
        logprobs: Sequence[TokenLogprob] | None = None,
        offset: int = 0,
    ) -> dict:
        """A streamed piece; the chat's first delta carries the role, the last one the finish reason. ``logprobs``:
        those of the chunk's tokens (``offset``: the output's characters before them, for text completions)."""
        listed = self.logprobs(logprobs, offset) if logprobs is not None else None
        if self.kind == "chat":
            delta: dict = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": listed, "finish_reason": finish_reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text or "", "logprobs": listed, "finish_reason": finish_reason}
        return {**self._head("text_completion"), "choices": [choice]}

    def tool_calls_chunk(self, calls: Sequence[ToolCall]) -> dict:
        """A streamed delta with the reply's tool calls, whole (each with its index, id, name and arguments)."""
        delta = {"tool_calls": [call.as_openai(index) for index, call in enumerate(calls)]}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        return {**self._head("chat.completion.chunk"), "choices": [choice]}

    def echoed_logprobs(
        self, prompt: Sequence[int], scored: Sequence[TokenLogprob | None], listed: dict
    ) -> dict:
        """A text completion's ``logprobs`` with the prompt's tokens first (the first has none: null, as OpenAI's
        legacy completions give it), the offsets running over the prompt's text."""
        tokens = [self.token_text(t) for t in prompt]
        values = [None if item is None else item.logprob for item in scored]
        tops = [None if item is None else {self.token_text(t): lp for t, lp in item.top} for item in scored]
        offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
        start = sum(len(t) for t in tokens)
        return {
            "tokens": tokens + listed["tokens"],
            "token_logprobs": values + listed["token_logprobs"],
            "top_logprobs": tops + listed["top_logprobs"],
            "text_offset": offsets + [o + start for o in listed["text_offset"]],
        }

    def token_text(self, token: int) -> str:
        assert self.piece is not None
        return self.piece(token).decode("utf-8", errors="replace")

    def logprobs(self, items: Sequence[TokenLogprob], offset: int = 0) -> dict:
        """OpenAI's ``logprobs`` object: chat's ``content`` list, or the completions' parallel lists."""
        assert self.piece is not None, "a response with log-probabilities needs the model's token pieces"
        piece, text = self.piece, self.token_text

        if self.kind == "chat":
            return {
                "content": [
                    {
                        "token": text(item.token),
                        "logprob": item.logprob,
                        "bytes": list(piece(item.token)),
                        "top_logprobs": [
                            {"token": text(t), "logprob": lp, "bytes": list(piece(t))} for t, lp in item.top
                        ],
                    }
                    for item in items
                ],
                "refusal": None,
            }
        offsets = []
        for item in items:
            offsets.append(offset)
            offset += len(text(item.token))
        return {
            "tokens": [text(item.token) for item in items],
            "token_logprobs": [item.logprob for item in items],
            "top_logprobs": [{text(t): lp for t, lp in item.top} for item in items],
            "text_offset": offsets,
        }

    def usage_chunk(self, outcome: Outcome) -> dict:
        """The extra last chunk of ``stream_options.include_usage``: no choices, the usage."""
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage(outcome.finished.stats)}
