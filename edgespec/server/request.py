"""One request as the worker runs it: what :mod:`.prepare` makes of a request body and :mod:`.worker` and
:mod:`.responses` read. Plain data, importing neither of them, so neither imports the other for it."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from edgespec.sampling import SamplingParams
from edgespec.tools import Tool, ToolFormat


@dataclass(frozen=True)
class ToolUse:
    """A chat request's tools, and how its model writes calls to them."""

    format: ToolFormat
    tools: tuple[Tool, ...]
    choice: str  # "auto", "required" or the name of the function that must be called
    # parallel_tool_calls: a required call may be several. Off unless asked for, as in llama-server: unconstrained
    # by a stop, a small model asked for "one or more" calls keeps calling until max_tokens.
    several: bool = False

    @property
    def template_tools(self) -> list[dict]:
        return [t.as_template_dict() for t in self.tools]


@dataclass(frozen=True)
class GenerationRequest:
    """One request as the worker runs it."""

    prompt: tuple[int, ...]
    params: SamplingParams
    draft_len: int | str  # "auto" or a fixed γ (0 = plain decoding)
    lookup: bool
    n: int = 1  # choices: requests of the same prompt, each with its own seed
    echo: str | None = None  # completions with echo: the prompt's text, which the response starts with
    tools: ToolUse | None = None  # chat with tools: how to read calls out of the reply
    cache_prompt: bool = True  # llama-server's field: false decodes the whole prompt, keeping none of the KV
    cache_scope: Hashable | None = None  # the suffix cache's scope: whose earlier replies it drafts from (None: none)
