"""The workload suite: task classes of chat prompts (edgespec/workloads/*.toml, or the user's own), and a prompt
rendered into the target's tokens with the constraint its reply is held to."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgespec.constraint import Grammar
from edgespec.errors import EdgespecError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

if TYPE_CHECKING:
    from edgespec.models.backend import Model


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: tuple[dict, ...]  # chat messages (role, content), rendered with the target's own template
    json_schema: str | None = None  # the reply must be a JSON document valid under this schema (JSON text)
    tools: str | None = None  # the reply must call one of these tools (OpenAI's tools list, JSON text)
    # Prompts of one sequence run in order through one runtime, each a fresh conversation (the agent class): what the
    # runtime wrote for the earlier ones may draft the later ones.
    sequence: str | None = None

    @property
    def constrained(self) -> bool:
        return self.json_schema is not None or self.tools is not None


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    prompts: tuple[Prompt, ...]
    in_default_suite: bool = True  # False: run only when named (a class that needs a runtime run in order)

    def sequences(self) -> dict[str, list[Prompt]]:
        """The task's prompts by sequence, each in order (a prompt without one is a sequence of its own)."""
        out: dict[str, list[Prompt]] = {}
        for p in self.prompts:
            out.setdefault(p.sequence or p.id, []).append(p)
        return out


def _parse_task(text: str, source: str) -> Task:
    try:
        raw = tomllib.loads(text)
        prompts = tuple(
            Prompt(
                str(p["id"]),
                tuple({"role": m["role"], "content": m["content"]} for m in p["messages"]),
                _json_text(p.get("json_schema")),
                _json_text(p.get("tools")),
                None if p.get("sequence") is None else str(p["sequence"]),
            )
            for p in raw["prompts"]
        )
        task = Task(str(raw["name"]), str(raw.get("description", "")), prompts, bool(raw.get("in_default_suite", True)))
    except (tomllib.TOMLDecodeError, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise EdgespecError(f"{source}: not a workload file ({exc})") from exc
    if not task.prompts:
        raise EdgespecError(f"{source}: the task {task.name!r} has no prompts")
    return task


def load_tasks(
    names: Sequence[str] | None = None, *, prompts_per_task: int | None = None, source: Path | None = None
) -> list[Task]:
    """The task classes to run, in the suite's order (``names`` picks and orders a subset).

    ``source``: a workload ``.toml`` or a folder of them instead of the suite shipped in edgespec/workloads. A shipped
    class with ``in_default_suite = false`` (``agent``) runs only when ``names`` names it.
    """
    if source is None:
        shipped = resources.files("edgespec").joinpath("workloads")
        files = [(f.name, f.read_text("utf-8")) for f in shipped.iterdir() if f.name.endswith(".toml")]
    elif source.is_dir():
        files = [(str(f), f.read_text("utf-8")) for f in source.glob("*.toml")]
    else:
        files = [(str(source), source.read_text("utf-8"))]
    parsed = sorted((_parse_task(text, name) for name, text in files), key=lambda t: t.name)
    suite = {t.name: t for t in parsed}
    if names:
        unknown = [n for n in names if n not in suite]
        if unknown:
            raise EdgespecError(f"unknown task {', '.join(unknown)}; the suite has: {', '.join(suite)}")
        tasks = [suite[n] for n in names]
    else:
        tasks = [t for t in suite.values() if t.in_default_suite or source is not None]
    if prompts_per_task is not None:
        tasks = [Task(t.name, t.description, t.prompts[:prompts_per_task], t.in_default_suite) for t in tasks]
    return tasks


def _json_text(value: Any) -> str | None:
    """A workload's JSON field (a TOML string of JSON), checked."""
    if value is None:
        return None
    json.loads(value)
    return str(value)


def render_prompt(model: Model, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> list[int]:
    """Tokens of ``messages`` in the model's chat format, as ``Runtime.chat`` would send them."""
    from edgespec.api import Runtime
    from edgespec.engine import Engine

    return Runtime(Engine(model, None, draft_len=0, lookup=False)).render_chat(messages, tools)


def prompt_job(model: Model, prompt: Prompt) -> tuple[list[int], Grammar | None]:
    """A workload prompt's tokens (its tools in the chat template), and the constraint its reply is held to: its JSON
    schema, or a call of one of its tools (as a server's ``tool_choice: required`` makes it)."""
    from edgespec.tools import call_grammar, markers_are_tokens, parse_tools, template_format

    if prompt.tools is None:
        grammar = Grammar.json_schema(prompt.json_schema) if prompt.json_schema is not None else None
        return render_prompt(model, prompt.messages), grammar
    tools = parse_tools(json.loads(prompt.tools))
    listed = [t.as_template_dict() for t in tools]
    fmt = template_format(model.chat_template)
    if fmt is None:
        # A template that takes no tools (a server refuses them there): the bench lists them in a system message
        # and holds the reply to the Hermes call format, so every model runs the class.
        fmt = "hermes"
        system = (
            "You may call these functions:\n<tools>\n" + "\n".join(json.dumps(t) for t in listed) + "\n</tools>\n"
            'Reply with one call: <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
            "</tool_call>"
        )
        tokens = render_prompt(model, ({"role": "system", "content": system}, *prompt.messages))
    else:
        tokens = render_prompt(model, prompt.messages, listed)
    return tokens, call_grammar(fmt, tools, special_markers=markers_are_tokens(model), several=False)
