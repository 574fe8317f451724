"""Screens over the chat: the key and command help, and model loading."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import ProgressBar, Static

from edgespec.chat.session import COMMANDS

# (key as shown, what it does): also the source of the bindings' descriptions in the app
KEYS: list[tuple[str, str]] = [
    ("Enter", "send the message"),
    ("Esc", "stop the reply being generated (the partial reply is kept)"),
    ("Ctrl+S", "speculation off / back on (draft length 0 vs the previous setting)"),
    ("F4 / F5", "draft length down / up: off, 1 … 8, auto"),
    ("F2 / F3", "temperature down / up by 0.1"),
    ("Ctrl+T", "highlighting of accepted draft tokens off / on"),
    ("Ctrl+L", "clear: start a new conversation (the current one stays saved)"),
    ("F1", "this help"),
    ("Ctrl+Q", "save and quit"),
]


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical {
        width: 90; height: auto; max-height: 90%; padding: 1 2; border: round $accent; background: $surface;
    }
    """

    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close", priority=True)]

    def compose(self) -> ComposeResult:
        keys = Table.grid(padding=(0, 2))
        keys.add_column(style="bold")
        keys.add_column()
        for key, text in KEYS:
            keys.add_row(key, text)
        commands = Table.grid(padding=(0, 2))
        commands.add_column(style="bold")
        commands.add_column()
        for name, (arg, text) in COMMANDS.items():
            commands.add_row(f"/{name} {arg}".rstrip(), text)
        with Vertical():
            yield Static("[b]Keys[/b]")
            yield Static(keys)
            yield Static("\n[b]Commands[/b] (type them in the input box)")
            yield Static(commands)
            yield Static(
                "\nHighlighted text came from accepted draft tokens; plain text the target sampled itself "
                "(a correction or the bonus token of a round). Either way the output follows the target's "
                "distribution.\n[dim]Esc, F1 or q closes this help.[/dim]"
            )


class LoadingPanel(Vertical):
    """Shown in place of the conversation while the models load."""

    DEFAULT_CSS = """
    LoadingPanel { height: auto; padding: 1 2; }
    LoadingPanel > ProgressBar { margin-top: 1; }
    """

    def __init__(self) -> None:
        super().__init__(id="loading")
        self._label = Static("loading…", markup=False)
        self._bar = ProgressBar(total=100, show_eta=False)

    def compose(self) -> ComposeResult:
        yield self._label
        yield self._bar

    def show(self, stage: str, fraction: float) -> None:
        self._label.update(f"loading {stage} model…")
        self._bar.update(progress=round(100 * fraction))
