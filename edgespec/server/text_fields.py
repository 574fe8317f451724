"""Lone UTF-16 surrogates in a request body: refused in one place, before any field is read.

JSON may escape a surrogate without its pair (``"\\ud800"``); Python decodes it to a ``str`` that cannot be
encoded as UTF-8, so it would fail wherever the text goes next (the tokenizer, the chat template, the constraint
compiler, a response or a log line). The server's rule: a request whose body holds one anywhere, in a value or
in an object's key, gets a 400 that names the JSON path of that string (``messages[0].content``, ``stop[1]``,
``logit_bias``). Nothing is replaced silently, so a client learns that its text was not what it meant.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from edgespec.server.errors import bad_request


def is_lone_surrogate_free(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8: it holds no surrogate code point (a pair in JSON decodes to one
    character, so only a lone half is left as a surrogate)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def find_lone_surrogate(data: Any) -> str | None:
    """The JSON path of the first string in ``data`` (parsed JSON) holding a lone surrogate, or None.

    A key is named by the object that holds it: ``logit_bias`` for a bad key of ``logit_bias``. Iterative, so a
    deeply nested body cannot overflow the stack here.
    """
    for path, text in _strings(data):
        if not is_lone_surrogate_free(text):
            return path or "body"
    return None


def check_text_fields(data: Any) -> None:
    """A 400 naming the field when any string of the request body holds a lone surrogate."""
    path = find_lone_surrogate(data)
    if path is not None:
        raise bad_request(
            f"{path} holds a lone UTF-16 surrogate (an escape such as \\ud800 without its pair), which is not "
            "text: send the character itself or its escaped surrogate pair",
            param=path,
        )


def _strings(data: Any) -> Iterator[tuple[str, str]]:
    """Every string of ``data`` with the path that reaches it, keys included (at their object's path)."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            yield path, value
        elif isinstance(value, dict):
            items = list(value.items())
            for key, item in reversed(items):  # reversed: the stack pops them in the body's order
                stack.append((f"{path}.{key}" if path else key, item))
            for key, _ in items:
                yield path, key
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in reversed(list(enumerate(value))))
