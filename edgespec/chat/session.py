"""One chat, independent of how it is shown: the conversation, its settings, and each turn streamed and saved.

The TUI (``tui/``) and the plain REPL (:mod:`edgespec.chat.repl`) are two views of a :class:`ChatSession`; the
slash commands they share are parsed here too.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from edgespec.chat.history import ChatStore, Conversation, Message, merge_spans
from edgespec.engine import parse_draft_len
from edgespec.errors import ContextOverflowError, EdgespecError, InvalidParameterError
from edgespec.events import Event, Finished, Stats
from edgespec.sampling import SamplingParams

if TYPE_CHECKING:
    from edgespec.api import Runtime

# name -> (argument, what it does); the order is the order of /help
COMMANDS: dict[str, tuple[str, str]] = {
    "help": ("", "list the commands"),
    "clear": ("", "start a new conversation (the current one stays saved)"),
    "temp": ("T", "set the temperature (0 = greedy)"),
    "draft": ("auto|N|off", "draft length: the controller decides, a fixed N, or no speculation"),
    "spec": ("", "turn speculation off / back on"),
    "highlight": ("", "turn highlighting of accepted draft tokens off / on (TUI)"),
    "stop": ("", "stop the reply being generated (TUI; Ctrl+C in the REPL)"),
    "quit": ("", "save and leave"),
}

_COMMAND_RE = re.compile(r"/(\w+)(?:\s+(.*))?", re.DOTALL)


@dataclass(frozen=True)
class Command:
    name: str
    arg: str = ""


def parse_command(line: str) -> Command | None:
    """``/name [arg]`` as a :class:`Command`; None for an ordinary message.

    A line like ``/usr/bin is ...`` is a message (the word after the slash is followed by another slash).
    An unknown ``/word`` raises, so a typo is not sent to the model.
    """
    match = _COMMAND_RE.fullmatch(line.strip())
    if match is None:
        return None
    name, arg = match.group(1).lower(), (match.group(2) or "").strip()
    if name not in COMMANDS:
        raise EdgespecError(f"unknown command /{name}; /help lists the commands")
    return Command(name, arg)


def help_lines() -> list[str]:
    return [f"/{name} {arg}".ljust(20) + text for name, (arg, text) in COMMANDS.items()]


def describe_draft_len(draft_len: int | str) -> str:
    return "off" if draft_len == 0 else str(draft_len)


class ChatSession:
    """A conversation with a loaded :class:`~edgespec.api.Runtime`, saved to a :class:`ChatStore` as it goes.

    :meth:`reply` runs on a worker thread while the UI thread reads the session; settings change only between
    replies (the engine reads them when a request starts).
    """

    def __init__(
        self,
        runtime: Runtime,
        params: SamplingParams,
        store: ChatStore,
        conversation: Conversation | None = None,
        *,
        autosave_interval: float = 1.0,
    ) -> None:
        self.runtime = runtime
        self.params = params
        self.store = store
        self.conversation = conversation or Conversation()
        self.autosave_interval = autosave_interval
        # What "speculation on" goes back to after it was turned off.
        self._speculative_len: int | str = runtime.draft_len if runtime.draft_len != 0 else "auto"
        # Replies generated in this session (not those of a resumed chat's past).
        self.session_drafted = 0
        self.session_accepted = 0
        self.save_error: str | None = None
        self._save_lock = threading.Lock()
        self._lock = threading.Lock()  # guards _busy and _pending_draft_len: the UI and the reply thread
        self._busy = False
        self._pending_draft_len: int | str | None = None

    # ----- settings ----------------------------------------------------------------------------------------
    @property
    def draft_len(self) -> int | str:
        """The draft length in force, or the one that takes over when the running reply ends."""
        with self._lock:
            return self._pending_draft_len if self._pending_draft_len is not None else self.runtime.draft_len

    @property
    def speculating(self) -> bool:
        return self.draft_len != 0

    def set_temperature(self, temperature: float) -> None:
        # Sampling params are read when a reply starts, so a change mid-reply applies to the next one.
        self.params = replace(self.params, temperature=round(max(0.0, temperature), 2))

    def set_draft_len(self, draft_len: int | str) -> None:
        """Change γ now, or when the running reply ends (the engine must not be reconfigured mid-request)."""
        draft_len = parse_draft_len(draft_len)
        if draft_len != 0:
            self._speculative_len = draft_len
        with self._lock:
            if self._busy:
                self._pending_draft_len = draft_len
                return
        self.runtime.set_draft_len(draft_len)

    def toggle_speculation(self) -> None:
        self.set_draft_len(0 if self.speculating else self._speculative_len)

    def clear(self) -> None:
        """Start a new conversation with the same system prompt and models; the old one stays on disk."""
        old = self.conversation
        self.conversation = Conversation(system=old.system, target=old.target, draft=old.draft)

    def apply(self, command: Command) -> str | None:
        """Run a command that changes the session and say what it did; None for a command the view handles."""
        if command.name == "clear":
            self.clear()
            return "new conversation"
        if command.name == "temp":
            try:
                temperature = float(command.arg)
            except ValueError:
                raise InvalidParameterError(f"/temp needs a number, got {command.arg!r}") from None
            self.set_temperature(temperature)
            return f"temperature {self.params.temperature:g}"
        if command.name == "draft":
            self.set_draft_len(parse_draft_len(command.arg or "auto"))
            return f"draft length {describe_draft_len(self.draft_len)}"
        if command.name == "spec":
            self.toggle_speculation()
            state = "on" if self.speculating else "off"
            return f"speculation {state} (draft length {describe_draft_len(self.draft_len)})"
        return None

    # ----- a turn -------------------------------------------------------------------------------------------
    def session_rate(self, current: Stats | None = None) -> float | None:
        """Acceptance over this session's replies plus ``current`` (streaming); None before any draft."""
        drafted = self.session_drafted + (current.drafted if current else 0)
        accepted = self.session_accepted + (current.accepted if current else 0)
        return accepted / drafted if drafted else None

    def reply(self, text: str, cancel: threading.Event | None = None) -> Iterator[Event]:
        """Add the user's message, stream the assistant's reply, and keep both in the saved conversation.

        An error before the first event (the conversation no longer fits, the engine is busy) takes the
        user's message back out and raises. Once the reply started, whatever was streamed is kept and saved,
        also when the caller stops early (``cancel``, closing this generator, an exception).
        """
        conversation = self.conversation
        conversation.messages.append(Message("user", text))
        self._set_busy(True)
        try:
            prompt, params = self._request()
            events = self.runtime.stream(prompt, params, cancel=cancel)
            first = next(events)  # the engine checks the request when it starts, before its first event
        except BaseException:
            conversation.messages.pop()
            self._set_busy(False)
            raise
        answer = Message("assistant", "", finish_reason="cancelled")
        conversation.messages.append(answer)
        self.save()  # the user's message is on screen: keep it even if the process dies mid-reply
        pieces: list[tuple[str, bool]] = []
        last: Stats | None = None
        finished = False
        last_save = time.monotonic()
        try:
            for event in itertools.chain([first], events):
                if isinstance(event, Finished):
                    answer.content, answer.finish_reason = event.text, event.finish_reason
                    answer.spans, answer.stats = merge_spans(pieces), event.stats.as_dict()
                    self._count(event.stats)
                    finished = True
                else:
                    pieces.extend((span.text, span.from_draft) for span in event.spans)
                    last = event.stats
                    if time.monotonic() - last_save >= self.autosave_interval:
                        # A crash mid-reply loses at most this interval of what was shown.
                        answer.content, answer.spans = "".join(t for t, _ in pieces), merge_spans(pieces)
                        self.save()
                        last_save = time.monotonic()
                yield event
        except Exception:
            answer.finish_reason = "error"
            raise
        finally:
            events.close()  # an early exit closes the engine's generator, which rolls its caches back
            if not finished:
                answer.content, answer.spans = "".join(t for t, _ in pieces), merge_spans(pieces)
                if last is not None:
                    answer.stats = last.as_dict()
                    self._count(last)
            self.save()
            self._set_busy(False)

    def _set_busy(self, busy: bool) -> None:
        with self._lock:
            self._busy = busy
            pending, self._pending_draft_len = self._pending_draft_len, None
        if not busy and pending is not None:
            self.runtime.set_draft_len(pending)

    def save(self) -> None:
        """Save the conversation. A failure goes to :attr:`save_error`: it must not end a reply."""
        with self._save_lock:
            try:
                self.store.save(self.conversation)
                self.save_error = None
            except OSError as exc:
                self.save_error = f"could not save the chat to {self.store.root}: {exc}"

    def _count(self, stats: Stats) -> None:
        self.session_drafted += stats.drafted
        self.session_accepted += stats.accepted

    def _request(self) -> tuple[list[int], SamplingParams]:
        """The prompt tokens, and the params with max_tokens cut to what still fits in the context."""
        prompt = self.runtime.render_chat(self.conversation.for_model())
        n_ctx = self.runtime.context_size
        if self.runtime.draft is not None:
            n_ctx = min(n_ctx, self.runtime.draft.n_ctx)
        headroom = self.runtime.engine.max_gamma  # the verify batch reaches γ tokens past the committed text
        room = n_ctx - len(prompt) - headroom
        if room < 1:
            raise ContextOverflowError(
                f"the conversation ({len(prompt)} tokens) fills the context ({n_ctx} tokens, {headroom} kept "
                "for drafts): /clear starts a new chat (this one stays saved), or use a larger --n-ctx"
            )
        return prompt, replace(self.params, max_tokens=min(self.params.max_tokens, room))


def speedup(stats: Stats) -> float | None:
    """The rate of the engine's rounds over the plain-decoding rate the controller estimated; None while unknown.

    Only the rounds' own time counts (drafting, verifying, sampling), not the time a consumer held the stream
    between chunks: a TUI drawing on a 2-core machine slowed replies by ~15 % in wall time, which is not a
    cost of speculation (it was measured with no drafts at all) and would read as a loss here.
    """
    busy = stats.t_draft + stats.t_verify + stats.t_sample
    if stats.plain_tokens_per_second > 0 and busy > 0 and stats.generated > 0:
        return stats.generated / busy / stats.plain_tokens_per_second
    return None


def stats_summary(stats: Stats) -> str:
    """One line about a reply, for the REPL and the TUI's message footer."""
    parts = [f"{stats.generated} tokens", f"{stats.tokens_per_second:.1f} tok/s"]
    if not stats.drafted:
        return " · ".join([*parts, "no drafts"])
    parts += [
        f"accepted {stats.accepted}/{stats.drafted} ({stats.acceptance_rate:.0%})",
        f"{stats.tokens_per_verify:.2f} tokens/verify",
    ]
    gain = speedup(stats)
    if gain is not None:
        parts.append(f"{gain:.2f}× plain")
    return " · ".join(parts)
