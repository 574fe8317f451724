"""The chat's widgets: messages (with draft-token highlighting), the acceptance meter and the status line."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widget import Widget
from textual.widgets import Markdown, Sparkline, Static

from edgespec.chat.history import Message, merge_spans
from edgespec.chat.session import ChatSession, describe_draft_len, speedup, stats_summary
from edgespec.events import Finished, Stats

if TYPE_CHECKING:
    from edgespec.api import ModelInfo

# Text of accepted draft tokens; text the target sampled itself keeps the default style.
DRAFT_STYLE = "bold #9be9a8 on #1b3324"

SPARK_ROUNDS = 60  # the meter's sparkline shows the latest rounds of the reply

FINISH_NOTES = {
    "cancelled": "stopped",
    "length": "length limit",
    "error": "interrupted by an error",
}


class SpanBlock(Widget):
    """One paragraph of a reply as (text, from_draft) pieces.

    A reply is a column of these: a blank line closes a block for good, so while a reply streams only its last
    paragraph is re-rendered, never the whole reply (which would make streaming quadratic).
    """

    DEFAULT_CSS = """
    SpanBlock { height: auto; margin-bottom: 1; }
    """

    def __init__(self, highlight: bool) -> None:
        super().__init__()
        self.pieces: list[tuple[str, bool]] = []
        self.highlight = highlight

    def add(self, text: str, from_draft: bool) -> None:
        self.pieces.append((text, from_draft))
        self.refresh(layout=True)

    def set_highlight(self, on: bool) -> None:
        self.highlight = on
        self.refresh()

    def render(self) -> Text:
        text = Text()
        for piece, from_draft in merge_spans(self.pieces):
            text.append(piece, DRAFT_STYLE if (from_draft and self.highlight) else None)
        text.rstrip()  # the blank line that closed the block is the CSS margin's job
        return text


class UserMessage(Static):
    DEFAULT_CSS = """
    UserMessage {
        margin: 1 0 1 0; padding: 0 1; border-left: thick $accent; background: $boost; height: auto;
    }
    """

    def __init__(self, text: str) -> None:
        super().__init__(Text(text), markup=False)
        self.text = text


class Notice(Static):
    """A line from the app itself (an error, a setting changed), not part of the conversation."""

    DEFAULT_CSS = """
    Notice { color: $text-muted; padding: 0 1; height: auto; }
    Notice.error { color: $error; text-style: bold; }
    """

    def __init__(self, text: str, *, error: bool = False) -> None:
        super().__init__(Text(text), markup=False, classes="error" if error else "")
        self.text = text


class AssistantMessage(Vertical):
    """A reply: streamed as highlighted paragraphs, shown as Markdown once finished with highlighting off.

    ``saved`` builds the view of a reply from a saved chat instead of a streaming one.
    """

    DEFAULT_CSS = """
    AssistantMessage { height: auto; padding: 0 1; border-left: thick $success-darken-2; }
    AssistantMessage > .body { height: auto; }
    AssistantMessage > .footer { color: $text-muted; height: auto; }
    AssistantMessage Markdown { margin: 0; padding: 0; }
    """

    def __init__(self, highlight: bool, saved: Message | None = None) -> None:
        super().__init__()
        self.highlight = highlight
        self.pieces: list[tuple[str, bool]] = []  # the whole reply, to rebuild the view on a toggle
        self.finished = False
        self.text = ""
        self._saved = saved
        self._body = Vertical(classes="body")
        self._footer = Static("" if saved else "generating…", classes="footer", markup=False)
        self._block: SpanBlock | None = None
        self._after_newline = False

    def compose(self) -> ComposeResult:
        yield self._body
        yield self._footer

    def on_mount(self) -> None:
        saved = self._saved
        if saved is not None:
            self.pieces = list(saved.spans) or [(saved.content, False)]
            stats = Stats(**_stats_fields(saved.stats)) if saved.stats else None
            self._finish(saved.content, saved.finish_reason or "stop", stats)
            self._rebuild()

    # ----- streaming ----------------------------------------------------------------------------------------
    def append(self, pieces: Iterable[tuple[str, bool]]) -> None:
        for text, from_draft in pieces:
            if text:
                self.pieces.append((text, from_draft))
                self._feed(text, from_draft)

    def _feed(self, text: str, from_draft: bool) -> None:
        start = 0
        for i, ch in enumerate(text):
            if ch == "\n" and self._after_newline:  # a blank line: the paragraph is complete
                self._current().add(text[start : i + 1], from_draft)
                self._block = None
                start = i + 1
                self._after_newline = False
            else:
                self._after_newline = ch == "\n"
        if start < len(text):
            self._current().add(text[start:], from_draft)

    def _current(self) -> SpanBlock:
        if self._block is None:
            self._block = SpanBlock(self.highlight)
            self._body.mount(self._block)
        return self._block

    def finish(self, event: Finished) -> None:
        self._finish(event.text, event.finish_reason, event.stats)
        if not self.highlight:
            self._rebuild()  # the paragraphs become Markdown

    def stop(self, finish_reason: str) -> None:
        """End a reply that got no Finished event (an error mid-stream): keep what was shown."""
        self._finish("".join(text for text, _ in self.pieces), finish_reason, None)

    def _finish(self, text: str, finish_reason: str, stats: Stats | None) -> None:
        self.finished = True
        self.text = text
        note = FINISH_NOTES.get(finish_reason)
        summary = stats_summary(stats) if stats is not None else ""
        self._footer.update(" · ".join(part for part in (summary, note) if part))

    # ----- highlighting -------------------------------------------------------------------------------------
    def set_highlight(self, on: bool) -> None:
        if on == self.highlight:
            return
        self.highlight = on
        if self.finished:
            self._rebuild()  # switches between paragraphs and Markdown
        else:
            for block in self._body.query(SpanBlock):
                block.set_highlight(on)

    def _rebuild(self) -> None:
        self._body.remove_children()
        self._block, self._after_newline = None, False
        if self.finished and not self.highlight:
            self._body.mount(Markdown(self.text))
        else:
            for text, from_draft in self.pieces:
                self._feed(text, from_draft)

    @property
    def highlighted(self) -> list[str]:
        """The texts shown in the draft style right now (what a reader sees highlighted)."""
        out = []
        for block in self._body.query(SpanBlock):
            if block.highlight:
                out += [text for text, from_draft in merge_spans(block.pieces) if from_draft]
        return out


def _stats_fields(saved: dict) -> dict:
    """The Stats constructor's fields out of a saved ``Stats.as_dict()`` (derived values dropped)."""
    fields = set(Stats.__dataclass_fields__)
    out = {k: v for k, v in saved.items() if k in fields}
    if "accepted_per_round" in out:
        out["accepted_per_round"] = tuple(out["accepted_per_round"])
    return out


class ChatLog(VerticalScroll):
    """The conversation, scrolled to the newest text unless the reader scrolled up."""

    DEFAULT_CSS = """
    ChatLog { height: 1fr; padding: 0 1; }
    """

    def add(self, widget: Widget) -> Widget:
        self.mount(widget)
        self.follow()
        return widget

    def follow(self) -> None:
        if self.max_scroll_y - self.scroll_y <= 3:
            self.scroll_end(animate=False, immediate=False)


class Meter(Vertical):
    """Live acceptance: this reply and the session, tokens per verify and per second, γ, speedup."""

    DEFAULT_CSS = """
    Meter { width: 34; height: 1fr; border-left: solid $panel-lighten-2; padding: 0 1; }
    Meter > #meter-values { height: auto; }
    Meter > Sparkline { height: 3; margin-top: 1; }
    Meter > .caption { color: $text-muted; height: auto; }
    Meter > #meter-why { margin-top: 1; }
    """

    def __init__(self) -> None:
        super().__init__(id="meter")
        self.stats: Stats | None = None
        self.session_rate: float | None = None
        self.per_round: list[int] = []  # accepted drafts in each verify round of the current reply
        self._values = Static("", id="meter-values")
        self._spark = Sparkline([], id="meter-spark")
        self._caption = Static("accepted drafts per round", classes="caption")
        # The controller's last choice and its reason (estimated α, costs): why it is, or is not, speculating.
        self._why = Static("", id="meter-why", classes="caption", markup=False)

    def compose(self) -> ComposeResult:
        yield Static(Text("speculation", style="bold"))
        yield self._values
        yield self._spark
        yield self._caption
        yield self._why

    def on_mount(self) -> None:
        self._render_values()

    def start_reply(self) -> None:
        self.stats = None
        self.per_round = []
        self._spark.data = []
        self._caption.update("accepted drafts per round")
        self._why.update("")
        self._render_values()

    def show(self, stats: Stats, session_rate: float | None) -> None:
        # One chunk per verify round: the step in the accepted count is that round's accepted drafts.
        previous = self.stats
        if previous is None or stats.rounds < previous.rounds:
            previous = Stats()
        if stats.rounds > previous.rounds:
            self.per_round.append(stats.accepted - previous.accepted)
            self._spark.data = self.per_round[-SPARK_ROUNDS:]  # a bounded copy: O(1) per round
            # The sparkline scales between its own min and max (a steady 4 looks like a steady 0), so the
            # caption gives the numbers.
            self._caption.update(
                f"accepted drafts per round\nlast {self.per_round[-1]} · mean {stats.accepted / stats.rounds:.2f}"
            )
        self.stats = stats
        self.session_rate = session_rate
        self._render_values()
        self._why.update(f"why: {stats.decision}" if stats.decision else "")

    def values(self) -> dict[str, str]:
        s = self.stats
        if s is None:
            return {
                "reply": "–",
                "session": self._session(),
                "tokens/verify": "–",
                "tokens/s": "–",
                "draft": "–",
                "speedup": "–",
                "plain": "–",
            }
        gain = speedup(s)
        shown = {
            "reply": _pct(s.acceptance_rate) if s.drafted else "–",
            "session": self._session(),
            "tokens/verify": f"{s.tokens_per_verify:.2f}",
            "tokens/s": f"{s.tokens_per_second:.1f}",
            "draft": f"γ {s.draft_len} · {s.drafter}",
            "speedup": f"{gain:.2f}×" if gain is not None else "–",
            "plain": f"{s.plain_tokens_per_second:.1f} tok/s" if gain is not None else "–",
        }
        if s.forced:  # a constrained reply: tokens its constraint forced, drafted for free
            shown["forced"] = f"{s.forced} of {s.generated} tokens"
        if s.cache_drafted:  # free drafts from the prompt and from earlier replies, apart: accepted of drafted
            shown["from prompt"] = f"{s.lookup_accepted}/{s.lookup_drafted}"
            shown["from earlier"] = f"{s.cache_accepted}/{s.cache_drafted}"
        return shown

    def _session(self) -> str:
        return _pct(self.session_rate) if self.session_rate is not None else "–"

    def _render_values(self) -> None:
        table = Table.grid(padding=(0, 1))
        table.add_column(style="dim")
        table.add_column()
        for name, value in self.values().items():
            table.add_row(name, value)
        self._values.update(table)


def _pct(x: float) -> str:
    return f"{x:.0%}"


class StatusLine(Static):
    """Models, where they run, context use and the current settings."""

    DEFAULT_CSS = """
    StatusLine { dock: top; height: 3; background: $panel; padding: 0 1; }
    """

    def __init__(self) -> None:
        super().__init__("", id="status", markup=False)
        self.session: ChatSession | None = None
        self.highlight = True

    def show(self, session: ChatSession | None, highlight: bool, note: str = "") -> None:
        self.session, self.highlight = session, highlight
        self.update(self.describe(note))

    def describe(self, note: str = "") -> Text:
        if self.session is None:
            return Text(note or "loading…")
        rt, session = self.session.runtime, self.session
        lines = [_model_line("target", rt.target), _model_line("draft ", rt.draft)]
        settings = Text(no_wrap=True, overflow="ellipsis")
        settings.append("ctx ", "dim").append(f"{rt.context_used}/{rt.context_size}")
        settings.append("  T ", "dim").append(f"{session.params.temperature:g}")
        settings.append("  draft length ", "dim").append(describe_draft_len(session.draft_len))
        settings.append("  speculation ", "dim").append("on" if session.speculating else "off")
        settings.append("  highlight ", "dim")
        settings.append("on" if self.highlight else "off", DRAFT_STYLE if self.highlight else None)
        settings.append("  chat ", "dim").append(session.conversation.id)
        if note:
            settings.append(f"  {note}", "italic")
        lines.append(settings)
        return Text("\n").join(lines)


def _model_line(role: str, model: ModelInfo | None) -> Text:
    line = Text(no_wrap=True, overflow="ellipsis")
    line.append(f"{role} ", "dim")
    if model is None:
        return line.append("none (prompt lookup only)")
    line.append(model.name, "bold")
    line.append(f" · {model.description} · {model.placement}")
    return line.append(" · bit-exact") if model.bit_exact else line
