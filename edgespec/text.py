"""Token bytes → printable text, one token at a time.

Two things make streaming text harder than joining pieces: a UTF-8 character can be split across tokens (emit
only complete characters), and a stop string can straddle token boundaries (hold back any tail that could be
the start of a stop string until the next token settles it).
"""

from __future__ import annotations

from codecs import utf_8_decode
from collections.abc import Callable, Sequence


class TextStream:
    def __init__(self, piece: Callable[[int], bytes], stop: Sequence[str] = ()) -> None:
        self._piece = piece
        self._stop = tuple(stop)
        self._pending = b""  # the first bytes of a character the next token completes
        self._held = ""  # decoded text not yet released: it may begin a stop string
        self.parts: list[str] = []  # everything released so far
        self.stopped_by: str | None = None

    def feed(self, token: int) -> str:
        """Add one token; return the text that is now safe to show (possibly ""). Sets ``stopped_by`` on a stop."""
        data = self._pending + self._piece(token)
        # The codec's C function, not an incremental decoder object (a Python wrapper): this runs for every token.
        decoded, used = utf_8_decode(data, "replace", False)
        self._pending = data[used:]
        text = self._held + decoded
        if not self._stop:
            self._held = ""
            if text:
                self.parts.append(text)
            return text
        cut, hit = _earliest_stop(text, self._stop)
        if hit is not None:
            self._held = ""
            self.stopped_by = hit
            return self._release(text[:cut])
        keep = _longest_stop_prefix_suffix(text, self._stop)
        self._held = text[len(text) - keep :] if keep else ""
        return self._release(text[: len(text) - keep])

    def flush(self) -> str:
        """End of output: release what was held (it did not turn into a stop string) and any partial bytes."""
        text = self._held + utf_8_decode(self._pending, "replace", True)[0]
        self._pending, self._held = b"", ""
        return self._release(text)

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def _release(self, text: str) -> str:
        if text:
            self.parts.append(text)
        return text


def _earliest_stop(text: str, stops: Sequence[str]) -> tuple[int, str | None]:
    best, hit = len(text), None
    for s in stops:
        i = text.find(s)
        if i != -1 and i < best:
            best, hit = i, s
    return best, hit


def _longest_stop_prefix_suffix(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
    longest = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:k]):
                longest = k
                break
    return longest
