"""The Textual chat, driven by a pilot against the tiny real model (SmolLM2-135M as both target and draft).

The same model drafting for itself accepts nearly every draft, so highlighted spans are sure to appear.
Each test runs its app with ``asyncio.run`` (no pytest-asyncio needed).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest
from textual.widgets import Markdown

from edgespec.chat.history import ChatStore
from edgespec.errors import ModelNotFoundError
from edgespec.events import Chunk
from edgespec.models import devices
from edgespec.sampling import SamplingParams
from tui.app import ChatApp
from tui.screens import HelpScreen, LoadingPanel
from tui.widgets import AssistantMessage, Notice, SpanBlock, StatusLine, UserMessage

pytestmark = pytest.mark.real

GREEDY = SamplingParams(temperature=0, max_tokens=32)
SIZE = (120, 40)


@pytest.fixture(scope="module")
def runtime(tiny_model_path):
    from edgespec.api import load

    # One thread: llama.cpp's spinning workers and the UI thread would fight over this machine's two cores.
    rt = load(tiny_model_path, tiny_model_path, n_ctx=2048, n_threads=1, draft_len=4)
    yield rt
    rt.close()


@pytest.fixture
def store(tmp_path) -> ChatStore:
    return ChatStore(tmp_path / "chats")


async def wait_until(pilot, condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the app"
        await pilot.pause(0.02)


async def send(app: ChatApp, pilot, text: str) -> None:
    """Type ``text`` (set, not typed key by key: faster) and press Enter, then wait for the reply to end."""
    await wait_until(pilot, lambda: app.session is not None and not app.prompt_input.disabled)
    app.prompt_input.value = text
    await pilot.press("enter")
    await wait_until(pilot, lambda: not app.generating)
    await pilot.pause()


async def start_held_reply(app: ChatApp, pilot, text: str, first_chunk: threading.Event) -> None:
    """Send ``text`` and wait until the (held) engine has produced its first chunk: the reply is under way."""
    await wait_until(pilot, lambda: app.session is not None)
    app.prompt_input.value = text
    await pilot.press("enter")
    await wait_until(pilot, first_chunk.is_set)


def replies(app: ChatApp) -> list[AssistantMessage]:
    return list(app.query(AssistantMessage))


def test_reply_meter_and_highlighting(runtime, store):
    async def scenario() -> None:
        app = ChatApp(runtime, GREEDY, store)
        async with app.run_test(size=SIZE) as pilot:
            await send(app, pilot, "Write a short poem about the sea.")
            finished = app.last_finished
            assert finished is not None and finished.text

            # The transcript on screen and on disk.
            assert [u.text for u in app.query(UserMessage)] == ["Write a short poem about the sea."]
            (reply,) = replies(app)
            assert reply.finished and reply.text == finished.text
            assert "".join(text for text, _ in reply.pieces) == finished.text
            saved = store.load(app.session.conversation.id)
            assert [(m.role, m.content) for m in saved.messages] == [
                ("user", "Write a short poem about the sea."),
                ("assistant", finished.text),
            ]
            assert saved.messages[1].stats == finished.stats.as_dict()

            # The meter shows exactly the engine's numbers.
            stats, meter = finished.stats, app.meter
            assert meter.stats == stats
            values = meter.values()
            assert values["reply"] == f"{stats.acceptance_rate:.0%}"
            assert values["session"] == f"{stats.acceptance_rate:.0%}"  # the session's only reply
            assert values["tokens/verify"] == f"{stats.tokens_per_verify:.2f}"
            assert values["tokens/s"] == f"{stats.tokens_per_second:.1f}"
            assert values["draft"] == f"γ {stats.draft_len} · {stats.drafter}"
            if stats.plain_tokens_per_second > 0:
                busy = stats.t_draft + stats.t_verify + stats.t_sample
                assert values["speedup"] == f"{stats.generated / busy / stats.plain_tokens_per_second:.2f}×"
            assert len(meter.per_round) == stats.rounds and sum(meter.per_round) == stats.accepted
            assert stats.decision and str(meter.query_one("#meter-why").render()) == f"why: {stats.decision}"

            # The status line says where each model runs (-ngl auto: the CPU on a build without a GPU).
            status = str(app.query_one(StatusLine).describe())
            placement = runtime.target.placement
            on_gpu = bool(devices.gpu_devices())
            assert placement.startswith("GPU (") if on_gpu else placement == "CPU"
            assert "target SmolLM2" in status and f" · {placement}" in status and "draft  SmolLM2" in status

            # Accepted draft tokens are highlighted; the toggle turns that into plain Markdown and back.
            assert stats.accepted > 0
            highlighted = reply.highlighted
            assert highlighted and all(piece in finished.text for piece in highlighted)
            await pilot.press("ctrl+t")
            await pilot.pause()
            assert reply.highlighted == [] and not reply.query(SpanBlock)
            assert reply.query_one(Markdown)
            await pilot.press("ctrl+t")
            await pilot.pause()
            assert reply.highlighted == highlighted and not reply.query(Markdown)

    asyncio.run(scenario())


@pytest.fixture
def held(runtime, monkeypatch) -> tuple[threading.Event, threading.Event]:
    """Hold the engine after its first chunk until released, so a key lands mid-reply however fast the model."""
    first_chunk, release = threading.Event(), threading.Event()
    stream = runtime.stream

    def held_stream(*args, **kwargs):
        events = stream(*args, **kwargs)
        try:
            for event in events:
                yield event
                if isinstance(event, Chunk) and not first_chunk.is_set():
                    first_chunk.set()
                    release.wait(10)
        finally:
            events.close()

    monkeypatch.setattr(runtime, "stream", held_stream)
    return first_chunk, release


def test_stop_mid_reply_then_send_again(runtime, store, held):
    first_chunk, release = held

    async def scenario() -> None:
        app = ChatApp(runtime, SamplingParams(temperature=0, max_tokens=200), store)
        async with app.run_test(size=SIZE) as pilot:
            await start_held_reply(app, pilot, "Count from one to one hundred in words.", first_chunk)
            await pilot.press("escape")
            release.set()
            await wait_until(pilot, lambda: not app.generating)
            stopped = app.last_finished
            assert stopped.finish_reason == "cancelled"
            assert stopped.stats.generated < 200
            (reply,) = replies(app)
            assert reply.text == stopped.text and "stopped" in str(reply.query_one(".footer").render())
            saved = store.load(app.session.conversation.id).messages[-1]
            assert (saved.content, saved.finish_reason) == (stopped.text, "cancelled")

            # The engine is consistent: the next turn (with the partial reply in its history) runs normally.
            await send(app, pilot, "Thanks. Now say hello.")
            assert app.last_finished.finish_reason in ("eos", "stop", "length")
            assert len(app.session.conversation.messages) == 4
            assert len(store.load(app.session.conversation.id).messages) == 4

    asyncio.run(scenario())


def test_quitting_mid_reply_saves_the_partial_reply(runtime, store, held):
    first_chunk, release = held

    async def scenario() -> tuple[ChatApp, str]:
        app = ChatApp(runtime, SamplingParams(temperature=0, max_tokens=200), store)
        async with app.run_test(size=SIZE) as pilot:
            await start_held_reply(app, pilot, "Tell me a long story.", first_chunk)
            await pilot.pause()
            shown = "".join(text for text, _ in replies(app)[0].pieces)
            threading.Timer(0.2, release.set).start()  # quitting waits for the engine to finish its round
            await pilot.press("ctrl+q")
        return app, shown

    app, shown = asyncio.run(scenario())
    assert not app.is_running
    saved = store.load(app.session.conversation.id).messages
    assert [m.role for m in saved] == ["user", "assistant"]
    assert saved[1].finish_reason == "cancelled" and saved[1].content.startswith(shown)


def test_resume_shows_the_saved_chat_and_continues_it(runtime, store):
    async def first_session() -> str:
        app = ChatApp(runtime, GREEDY, store)
        async with app.run_test(size=SIZE) as pilot:
            await send(app, pilot, "Name three colors.")
            await pilot.press("ctrl+q")
        return app.session.conversation.id

    chat_id = asyncio.run(first_session())
    saved = store.latest()
    assert saved.id == chat_id

    async def resumed() -> None:
        app = ChatApp(runtime, GREEDY, store, saved)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.session is not None)
            await pilot.pause()
            assert [u.text for u in app.query(UserMessage)] == ["Name three colors."]
            (reply,) = replies(app)
            assert reply.text == saved.messages[1].content
            assert reply.highlighted  # the saved spans bring the highlighting back
            await send(app, pilot, "And three animals?")
            assert len(replies(app)) == 2
        assert [m.content for m in store.load(chat_id).messages][:3] == [
            "Name three colors.",
            saved.messages[1].content,
            "And three animals?",
        ]

    asyncio.run(resumed())


def test_a_full_context_is_a_message_not_a_crash(tiny_model_path, store):
    from edgespec.api import load

    small = load(tiny_model_path, n_ctx=128, n_threads=1)

    async def scenario() -> None:
        app = ChatApp(small, GREEDY, store)
        async with app.run_test(size=SIZE) as pilot:
            long_message = "Please summarise this. " + "The quick brown fox jumps over the lazy dog. " * 30
            await send(app, pilot, long_message)
            errors = [n for n in app.query(Notice) if n.has_class("error")]
            assert len(errors) == 1 and "fills the context" in errors[0].text
            assert app.is_running and not replies(app) and not app.query(UserMessage)
            assert app.prompt_input.value == long_message  # given back to edit
            assert app.session.conversation.messages == []

            await send(app, pilot, "Hi!")
            assert app.last_finished is not None and len(app.session.conversation.messages) == 2

    try:
        asyncio.run(scenario())
    finally:
        small.close()


def test_keys_and_commands_change_the_settings(runtime, store):
    async def scenario() -> None:
        app = ChatApp(runtime, SamplingParams(temperature=0.7, max_tokens=16), store)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.session is not None)
            session = app.session
            assert runtime.draft_len == 4
            await pilot.press("ctrl+s")
            assert runtime.draft_len == 0 and not session.speculating
            await pilot.press("ctrl+s")
            assert runtime.draft_len == 4
            await pilot.press("f5")
            assert runtime.draft_len == 5
            await pilot.press("f4", "f4")
            assert runtime.draft_len == 3
            await pilot.press("f3")
            assert session.params.temperature == pytest.approx(0.8)
            await pilot.press("f2", "f2")
            assert session.params.temperature == pytest.approx(0.6)

            for command in ("/temp 0", "/draft auto"):
                app.prompt_input.value = command
                await pilot.press("enter")
            assert session.params.temperature == 0 and runtime.draft_len == "auto"
            app.prompt_input.value = "/tmep 1"
            await pilot.press("enter")
            assert any("unknown command /tmep" in n.text for n in app.query(Notice))

            await pilot.press("f1")
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("escape")
            assert not isinstance(app.screen, HelpScreen)

            old_id = session.conversation.id
            await send(app, pilot, "Hello!")
            await pilot.press("ctrl+l")
            await pilot.pause()
            assert not replies(app) and session.conversation.id != old_id
            assert len(store.load(old_id).messages) == 2  # the cleared chat stays saved
            runtime.set_draft_len(4)

    asyncio.run(scenario())


def test_loading_shows_progress_and_load_errors(tiny_model_path, store):
    from edgespec.api import load

    stages: list[str] = []

    def factory(progress):
        def spy(stage: str, fraction: float) -> None:
            stages.append(stage)
            progress(stage, fraction)

        return load(tiny_model_path, n_ctx=256, n_threads=1, progress=spy)

    async def loads() -> None:
        app = ChatApp(factory, GREEDY, store)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.session is not None)
            assert "target" in stages and not app.query(LoadingPanel)
            assert not app.prompt_input.disabled
        app.runtime.close()

    def missing(progress):
        raise ModelNotFoundError("unknown model 'nope'")

    async def fails() -> None:
        app = ChatApp(missing, GREEDY, store)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.load_error is not None)
            await pilot.pause()
            assert any("unknown model 'nope'" in n.text for n in app.query(Notice))
            assert app.prompt_input.disabled and app.is_running

    asyncio.run(loads())
    asyncio.run(fails())


def test_the_meter_counts_the_tokens_a_constraint_forced() -> None:
    from edgespec.events import Stats
    from tui.widgets import Meter

    meter = Meter()
    meter.stats = Stats(generated=40, rounds=12, drafted=30, accepted=24, forced=15, drafter="forced", draft_len=3)
    assert meter.values()["forced"] == "15 of 40 tokens" and meter.values()["draft"] == "γ 3 · forced"
    meter.stats = Stats(generated=40, rounds=12, drafted=30, accepted=24)
    assert "forced" not in meter.values()  # an unconstrained reply: no row
    assert "from earlier" not in meter.values()  # nor, without drafts from earlier replies, rows by source


def test_the_meter_tells_drafts_from_the_prompt_and_from_earlier_replies_apart() -> None:
    from edgespec.events import Stats
    from tui.widgets import Meter

    meter = Meter()
    meter.stats = Stats(generated=40, rounds=12, drafted=30, accepted=24, lookup_drafted=10, lookup_accepted=6,
                        cache_drafted=20, cache_accepted=18, drafter="cache", draft_len=8)  # fmt: skip
    values = meter.values()
    assert values["from prompt"] == "6/10" and values["from earlier"] == "18/20" and values["draft"] == "γ 8 · cache"
