"""``edgespec chat``: a Textual chat that shows speculative decoding at work.

Generation runs in a thread worker and reaches the UI through ``call_from_thread``, so the UI keeps
answering keys (Esc stops a reply) while the engine works. The app takes a loaded runtime (tests inject one)
or a factory it calls in a worker while a progress bar shows the load.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Footer, Input

from edgespec.chat.history import ChatStore, Conversation
from edgespec.chat.session import ChatSession, Command, describe_draft_len, help_lines, parse_command
from edgespec.errors import EdgespecError
from edgespec.events import Chunk, Finished
from edgespec.sampling import SamplingParams
from tui.screens import HelpScreen, LoadingPanel
from tui.widgets import AssistantMessage, ChatLog, Meter, Notice, StatusLine, UserMessage

if TYPE_CHECKING:
    from edgespec.api import Runtime

log = logging.getLogger("edgespec.tui")

# (stage, fraction) -> None, as edgespec.api.load takes it
LoadProgress = Callable[[str, float], None]
RuntimeFactory = Callable[[LoadProgress], "Runtime"]

# F4/F5 walk these: speculation off, fixed lengths, then the adaptive controller.
DRAFT_STEPS: tuple[int | str, ...] = (0, 1, 2, 3, 4, 5, 6, 7, 8, "auto")


class ChatApp(App[None]):
    TITLE = "edgespec chat"
    ENABLE_COMMAND_PALETTE = False  # its key and footer space go to the chat's own keys
    CSS = """
    #main { height: 1fr; }
    #prompt { margin: 0 1; }
    """
    BINDINGS = [
        Binding("escape", "stop", "Stop", priority=True),
        Binding("ctrl+s", "toggle_speculation", "Spec", priority=True),
        Binding("f4", "draft_len(-1)", "Draft−"),
        Binding("f5", "draft_len(1)", "Draft+"),
        Binding("f2", "temperature(-0.1)", "Temp−"),
        Binding("f3", "temperature(0.1)", "Temp+"),
        Binding("ctrl+t", "toggle_highlight", "Highlight", priority=True),
        Binding("ctrl+l", "clear", "Clear", priority=True),
        Binding("f1", "help", "Help", priority=True),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(
        self,
        runtime: Runtime | RuntimeFactory,
        params: SamplingParams | None = None,
        store: ChatStore | None = None,
        conversation: Conversation | None = None,
        *,
        highlight: bool = True,
    ) -> None:
        super().__init__()
        self._factory: RuntimeFactory | None = runtime if callable(runtime) else None
        self.runtime: Runtime | None = None if callable(runtime) else runtime
        self.params = params or SamplingParams()
        self.store = store or ChatStore()
        self._conversation = conversation
        self.session: ChatSession | None = None
        self.highlight = highlight
        self.generating = False
        self.last_finished: Finished | None = None  # the latest reply's result (what the meter must show)
        self.load_error: str | None = None
        self._cancel: threading.Event | None = None
        self._reply_worker = None
        self._shutting_down = False

    # ----- layout and start-up ------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield StatusLine()
        with Horizontal(id="main"):
            yield ChatLog(id="log")
            yield Meter()
        yield Input(placeholder="Message · Enter sends · /help · F1 keys", id="prompt", disabled=True)
        yield Footer()

    @property
    def chat_log(self) -> ChatLog:
        return self.query_one(ChatLog)

    @property
    def meter(self) -> Meter:
        return self.query_one(Meter)

    @property
    def prompt_input(self) -> Input:
        return self.query_one("#prompt", Input)

    async def on_mount(self) -> None:
        if self.runtime is not None:
            await self._start_chat()
        else:
            await self.chat_log.mount(LoadingPanel())
            self._refresh_status("loading models…")
            self._load()

    @work(thread=True, exclusive=True, group="load")
    def _load(self) -> None:
        assert self._factory is not None
        shown: list[tuple[str, int]] = []

        def progress(stage: str, fraction: float) -> None:
            step = (stage, int(fraction * 50))  # llama.cpp reports often; a step of 2% is plenty to watch
            if not shown or shown[-1] != step:
                shown.append(step)
                self._ui(self._show_progress, stage, fraction)

        try:
            runtime = self._factory(progress)
        except EdgespecError as exc:
            self._ui(self._load_failed, str(exc))
        except Exception as exc:  # an unexpected failure is still a message in the app, not a traceback
            log.exception("loading failed")
            self._ui(self._load_failed, f"{type(exc).__name__}: {exc}")
        else:
            self._ui(self._loaded, runtime)

    def _show_progress(self, stage: str, fraction: float) -> None:
        self.query_one(LoadingPanel).show(stage, fraction)

    async def _loaded(self, runtime: Runtime) -> None:
        self.runtime = runtime
        await self.query_one(LoadingPanel).remove()
        await self._start_chat()

    async def _load_failed(self, message: str) -> None:
        self.load_error = message
        await self.query_one(LoadingPanel).remove()
        self._notice(f"error: {message}", error=True)
        self._notice("Ctrl+Q quits.")
        self._refresh_status("no model loaded")

    async def _start_chat(self) -> None:
        assert self.runtime is not None
        self.session = ChatSession(self.runtime, self.params, self.store, self._conversation)
        conversation = self.session.conversation
        self.sub_title = conversation.id
        widgets = []
        for message in conversation.messages:
            if message.role == "user":
                widgets.append(UserMessage(message.content))
            else:
                widgets.append(AssistantMessage(self.highlight, saved=message))
        if widgets:
            await self.chat_log.mount_all(widgets)
            self.chat_log.scroll_end(animate=False)
        self._refresh_status()
        self.prompt_input.disabled = False
        self.prompt_input.focus()

    # ----- sending and streaming ----------------------------------------------------------------------------
    async def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value
        if not text.strip():
            return
        try:
            command = parse_command(text)
        except EdgespecError as exc:
            self._notice(str(exc), error=True)
            return
        self.prompt_input.value = ""
        if command is not None:
            await self._command(command)
        elif self.session is None:
            self._notice("the models are not loaded", error=True)
        elif self.generating:
            self.prompt_input.value = text
            self.notify("A reply is being generated: Esc stops it.", severity="warning")
        else:
            await self.send(text)

    async def send(self, text: str) -> None:
        """Show the user's message and an empty reply, then stream into it from a worker."""
        user, reply = UserMessage(text), AssistantMessage(self.highlight)
        await self.chat_log.mount_all([user, reply])
        self.chat_log.scroll_end(animate=False)
        self.generating = True
        self._cancel = threading.Event()
        self.meter.start_reply()
        self._reply_worker = self._generate(text, user, reply, self._cancel)

    @work(thread=True, exclusive=True, group="reply")
    def _generate(self, text: str, user: UserMessage, reply: AssistantMessage, cancel: threading.Event) -> None:
        assert self.session is not None
        started = False
        events = self.session.reply(text, cancel)
        try:
            for event in events:
                started = True
                if isinstance(event, Chunk):
                    self._ui(self._on_chunk, reply, event)
                else:
                    self._ui(self._on_finished, reply, event)
        except EdgespecError as exc:
            self._ui(self._on_error, text, user, reply, str(exc), started)
        except Exception as exc:  # a bug must not take the conversation with it: report, keep what was shown
            log.exception("generation failed")
            self._ui(self._on_error, text, user, reply, f"{type(exc).__name__}: {exc}", started)
        finally:
            events.close()  # saves the (partial) reply
            self._ui(self._on_reply_done)

    def _on_chunk(self, reply: AssistantMessage, chunk: Chunk) -> None:
        assert self.session is not None
        reply.append((span.text, span.from_draft) for span in chunk.spans)
        self.meter.show(chunk.stats, self.session.session_rate(chunk.stats))
        self._refresh_status()
        self.chat_log.follow()

    def _on_finished(self, reply: AssistantMessage, finished: Finished) -> None:
        assert self.session is not None
        reply.finish(finished)
        self.last_finished = finished
        self.meter.show(finished.stats, self.session.session_rate())
        self.chat_log.follow()

    async def _on_error(
        self, text: str, user: UserMessage, reply: AssistantMessage, message: str, started: bool
    ) -> None:
        if started:
            reply.stop("error")
        else:  # nothing was generated and the session took the message back: so does the view
            await user.remove()
            await reply.remove()
            if not self.prompt_input.value:
                self.prompt_input.value = text
        self._notice(f"error: {message}", error=True)

    def _on_reply_done(self) -> None:
        self.generating = False
        self._cancel = None
        self._refresh_status()
        if self.session is not None and self.session.save_error:
            self._notice(f"warning: {self.session.save_error}", error=True)

    def _ui(self, callback: Callable, *args: object) -> None:
        """Run ``callback`` on the UI thread and wait for it; do nothing once the app is closing."""
        if self._shutting_down:
            return
        try:
            self.call_from_thread(callback, *args)
        except RuntimeError:  # the app stopped between the check and the call
            self._shutting_down = True

    # ----- commands and keys --------------------------------------------------------------------------------
    async def _command(self, command: Command) -> None:
        if command.name == "help":
            self._notice("\n".join(help_lines()))
        elif command.name == "stop":
            self.action_stop()
        elif command.name == "quit":
            await self.action_quit()
        elif command.name == "highlight":
            self.action_toggle_highlight()
        elif command.name == "clear":
            await self.action_clear()
        elif self.session is None:
            self._notice("the models are not loaded", error=True)
        else:
            try:
                self.notify(self.session.apply(command) or "")
            except EdgespecError as exc:
                self._notice(str(exc), error=True)
            self._refresh_status()

    def action_stop(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss()
        elif self._cancel is not None:
            self._cancel.set()  # the engine finishes its round, rolls back and reports "cancelled"

    def action_toggle_speculation(self) -> None:
        if self.session is not None:
            self.session.toggle_speculation()
            state = "on" if self.session.speculating else "off"
            draft_len = describe_draft_len(self.session.draft_len)
            self._setting_changed(f"speculation {state} (draft length {draft_len})")

    def action_draft_len(self, step: int) -> None:
        if self.session is None:
            return
        current = self.session.draft_len
        if current in DRAFT_STEPS:
            index = DRAFT_STEPS.index(current) + step
        else:  # a length set with /draft that F4/F5 do not visit: step from the nearest
            index = len(DRAFT_STEPS) - 2 if step < 0 else len(DRAFT_STEPS) - 1
        self.session.set_draft_len(DRAFT_STEPS[max(0, min(index, len(DRAFT_STEPS) - 1))])
        self._setting_changed(f"draft length {describe_draft_len(self.session.draft_len)}")

    def action_temperature(self, delta: float) -> None:
        if self.session is not None:
            self.session.set_temperature(self.session.params.temperature + delta)
            self._setting_changed(f"temperature {self.session.params.temperature:g}")

    def action_toggle_highlight(self) -> None:
        self.highlight = not self.highlight
        for reply in self.query(AssistantMessage):
            reply.set_highlight(self.highlight)
        self._refresh_status()

    async def action_clear(self) -> None:
        if self.session is None:
            return
        if self.generating:
            self.notify("Stop the reply first (Esc).", severity="warning")
            return
        self.session.clear()
        self.sub_title = self.session.conversation.id
        await self.chat_log.remove_children()
        self.meter.start_reply()
        self._refresh_status()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        await self.stop_reply()
        self.exit()

    async def stop_reply(self, timeout: float = 30.0) -> None:
        """Stop a running reply and wait until it is saved (a round takes well under a second)."""
        if self._cancel is not None:
            self._cancel.set()
        if self._reply_worker is not None:
            try:
                await asyncio.wait_for(self._reply_worker.wait(), timeout)
            except Exception:  # a worker that failed has reported itself; quitting goes on
                pass

    def on_unmount(self) -> None:
        # A crash or an external exit: stop the engine; the session saves the partial reply when it ends.
        self._shutting_down = True
        if self._cancel is not None:
            self._cancel.set()

    # ----- helpers ------------------------------------------------------------------------------------------
    def _setting_changed(self, text: str) -> None:
        if self.generating:
            text += " (from the next reply)"
        self.notify(text, timeout=2)
        self._refresh_status()

    def _notice(self, text: str, *, error: bool = False) -> None:
        self.chat_log.add(Notice(text, error=error))

    def _refresh_status(self, note: str = "") -> None:
        self.query_one(StatusLine).show(self.session, self.highlight, note)
