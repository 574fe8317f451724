"""Tool calls: how a model family writes them, the constraint that makes a model call one, and the parser that
reads them back out of its text.

The tools reach the model through its own chat template (the GGUF's Jinja template receives ``tools``); each
family then writes calls its own way:

* ``hermes`` (Qwen2.5, Qwen3 and others trained on the Hermes format): ``<tool_call>\\n{"name": ..., "arguments":
  {...}}\\n</tool_call>``, one block per call;
* ``llama3`` (Llama 3.1-3.3): the reply is one JSON object ``{"name": ..., "parameters": {...}}``.

A template that mentions neither cannot be given tools: the request is refused rather than answered with a model
that never saw them. ``tool_choice`` ``required`` or a named function is enforced with a constraint built from
the tools' parameter schemas (:func:`call_grammar`); ``auto`` leaves the model free, and a reply that is not a
well-formed call is plain text.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from edgespec.constraint import Grammar
from edgespec.errors import InvalidParameterError

ToolFormat = Literal["hermes", "llama3"]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]

    def as_template_dict(self) -> dict[str, Any]:
        """OpenAI's shape, which chat templates are written for."""
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = ""

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        call = {
            "id": self.id or f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }
        return call if index is None else {"index": index, **call}


def parse_tools(tools: Any) -> list[Tool]:
    """OpenAI's ``tools`` list, checked: each ``{"type": "function", "function": {"name", "parameters", ...}}``."""
    if not isinstance(tools, list) or not tools:
        raise InvalidParameterError("tools must be a non-empty list of {type: function, function: {...}}")
    out: list[Tool] = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise InvalidParameterError(f"tools[{i}] must be {{type: function, function: {{name, parameters}}}}")
        name = function.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name):
            raise InvalidParameterError(f"tools[{i}].function.name must be 1-64 letters, digits, _ . or -")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise InvalidParameterError(f"tools[{i}].function.parameters must be a JSON schema object")
        if any(t.name == name for t in out):
            raise InvalidParameterError(f"tools[{i}]: the function name {name!r} is given twice")
        out.append(Tool(name, str(function.get("description", "")), parameters))
    return out


def template_format(template: str | None) -> ToolFormat | None:
    """How the family whose chat template this is writes tool calls, or None when its template takes no tools."""
    if not template or "tools" not in template:
        return None
    if "<tool_call>" in template:
        return "hermes"
    if "<|python_tag|>" in template or '"parameters": dictionary' in template:
        return "llama3"
    return None


def _call_schema(tool: Tool, fmt: ToolFormat) -> dict[str, Any]:
    key = "arguments" if fmt == "hermes" else "parameters"
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, key: tool.parameters},
        "required": ["name", key],
        "additionalProperties": False,
    }


def call_grammar(fmt: ToolFormat, tools: Sequence[Tool], *, special_markers: bool, several: bool = True) -> Grammar:
    """The constraint of ``tool_choice`` ``required`` (any of ``tools``) or a named function (``tools`` holds just
    it): the family's call syntax around JSON that fits the tool's parameter schema; one call, or with ``several``
    (OpenAI's ``parallel_tool_calls``, and only where the family writes several) one or more.

    ``special_markers``: the model's vocabulary has ``<tool_call>`` and ``</tool_call>`` as special tokens, which
    the grammar then names as tokens (as text they would be spelled out in pieces the model never writes)."""
    schemas = [_call_schema(t, fmt) for t in tools]
    body = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    # %json embeds a JSON schema in llguidance's Lark; the layout matches what the template shows the model
    body = {**body, "x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}}
    json_rule = "%json " + json.dumps(body)
    if fmt == "llama3":
        return Grammar.lark(f"start: {json_rule}\n")
    open_tag, close_tag = ("<tool_call>", "</tool_call>") if special_markers else ('"<tool_call>"', '"</tool_call>"')
    more = ' ("\\n" call)*' if several else ""
    return Grammar.lark(f'start: call{more}\ncall: {open_tag} "\\n" {json_rule} "\\n" {close_tag}\n')


def markers_are_tokens(model: Any) -> bool:
    """Whether ``<tool_call>`` and ``</tool_call>`` are single (special) tokens of ``model``'s vocabulary, as in
    Qwen's: a call grammar then names them as tokens."""
    tags = ("<tool_call>", "</tool_call>")
    return all(len(model.tokenize(tag, add_special=False, parse_special=True)) == 1 for tag in tags)


_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_FENCED = re.compile(r"```[A-Za-z]*\s*\n(.*?)\n?\s*```", re.DOTALL)


def parse_calls(fmt: ToolFormat, text: str, tools: Sequence[Tool]) -> tuple[str | None, list[ToolCall]] | None:
    """The text outside the calls (None when there is none) and the calls, or None when ``text`` holds no
    well-formed call of a declared tool (then it is a plain reply)."""
    names = {t.name for t in tools}
    if fmt == "hermes":
        blocks = list(_HERMES_CALL.finditer(text))
        if not blocks:
            # Small models asked to call without a constraint sometimes write the call's JSON bare or in a code
            # fence instead: a whole reply that is exactly one call of a declared tool is read as that call.
            call = _call(_unfenced(text), "arguments", names)
            return None if call is None else (None, [call])
        calls = [_call(block.group(1), "arguments", names) for block in blocks]
        if any(c is None for c in calls):
            return None
        rest = _HERMES_CALL.sub("", text).strip()
        return (rest or None), [c for c in calls if c is not None]
    stripped = _unfenced(text.strip().removeprefix("<|python_tag|>"))
    call = _call(stripped, "parameters", names) or _call(stripped, "arguments", names)
    return None if call is None else (None, [call])


def _unfenced(text: str) -> str:
    """The text inside a reply that is one fenced code block, else the text."""
    whole = _FENCED.fullmatch(text.strip())
    return (whole.group(1) if whole else text).strip()


def _call(raw: str, key: str, names: set[str]) -> ToolCall | None:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    arguments = obj.get(key, {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string, as OpenAI sends them
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(obj["name"], arguments)


class CallStream:
    """A streamed reply that may hold tool calls: text is handed on as it comes, except what may turn out to be a
    call, which is held and, at the end, parsed into calls or handed on as text. What may be a call: the start of
    the reply while it reads as the start of one (the family's syntax, bare or fenced JSON), and in the Hermes
    format everything from a ``<tool_call>`` on (a reply may think or explain first)."""

    MARKER = "<tool_call>"

    def __init__(self, fmt: ToolFormat, tools: Sequence[Tool]) -> None:
        self.fmt, self.tools = fmt, tools
        self._held = ""  # text not handed on yet
        self._at_start = True  # nothing handed on yet: the whole reply may still be one call
        self._capturing = False  # a <tool_call> was seen: everything from it on is held

    def feed(self, text: str) -> str:
        """The part of ``text`` that can be shown now."""
        self._held += text
        if self._capturing:
            return ""
        if self._at_start:
            if self._may_be_a_call(self._held.lstrip()):
                return ""
            self._at_start = False
        if self.fmt != "hermes":
            out, self._held = self._held, ""
            return out
        at = self._held.find(self.MARKER)
        if at >= 0:  # a call begins: hand on what came before it, hold the rest
            self._capturing = True
            out, self._held = self._held[:at], self._held[at:]
            return out
        # keep back a tail that may be the start of the marker
        keep = next((n for n in range(min(len(self.MARKER) - 1, len(self._held)), 0, -1)
                     if self.MARKER.startswith(self._held[-n:])), 0)  # fmt: skip
        out, self._held = self._held[: len(self._held) - keep], self._held[len(self._held) - keep :]
        return out

    @staticmethod
    def _may_be_a_call(head: str) -> bool:
        """Whether a reply that starts with ``head`` may still be a call (see :func:`parse_calls`)."""
        for opener in ("<tool_call>", "<|python_tag|>", "```"):
            if opener.startswith(head):
                return True
            if head.startswith(opener):
                if opener != "```":
                    return True
                _, newline, body = head.partition("\n")
                return not newline or not body.strip() or body.lstrip().startswith("{")
        return head.startswith("{")

    def finish(self) -> tuple[str, list[ToolCall]]:
        """What is left: the held text, or the calls it holds (and the text around them)."""
        held, self._held = self._held, ""
        if not held or not (self._at_start or self._capturing):
            return held, []
        parsed = parse_calls(self.fmt, held, self.tools)
        if parsed is None:
            return held, []
        rest, calls = parsed
        return rest or "", calls


def template_tool_calls(messages: Sequence[dict], decode: Callable[[str], Any] = json.loads) -> list[dict]:
    """Messages as a chat template expects them: an assistant's ``tool_calls`` with their arguments as objects
    (OpenAI sends them as JSON strings; the templates write them with ``tojson``)."""
    out = []
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if calls:
            fixed = []
            for call in calls:
                function = dict(call.get("function", {}))
                if isinstance(function.get("arguments"), str):
                    try:
                        function["arguments"] = decode(function["arguments"])
                    except ValueError:
                        pass  # left as written
                fixed.append({**call, "function": function})
            message = {**message, "tool_calls": fixed}
        out.append(message)
    return out
