"""Render a conversation with the model's own chat template (from the GGUF), in a sandboxed Jinja environment.

A chat template is code shipped inside a model file: it runs in Jinja's ImmutableSandboxedEnvironment, never a
plain one. Models without a template fall back to ChatML, the format of the Qwen and SmolLM families.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from edgespec.errors import EdgespecError

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

ROLES = ("system", "user", "assistant", "tool")


def _raise(message: str) -> None:
    raise TemplateError(message)


@lru_cache(maxsize=8)
def _compile(source: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def render(
    messages: Sequence[dict],
    template: str | None,
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    tools: Sequence[dict] | None = None,
) -> str:
    """The prompt text for ``messages`` (dicts with ``role`` and ``content``; an assistant's may hold
    ``tool_calls``, a tool's ``tool_call_id``). ``tools``: the functions the model may call, in OpenAI's shape,
    for a template that takes them."""
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise EdgespecError(f"message {i} must be a dict with role in {ROLES} and a string content")
    try:
        return _compile(template or CHATML).render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            **({"tools": list(tools)} if tools else {}),
        )
    except TemplateError as exc:
        raise EdgespecError(f"the model's chat template failed: {exc}") from exc
