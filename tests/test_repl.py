"""The chat session, its commands and the plain REPL: a scripted fake runtime, then the CLI on the tiny model."""

from __future__ import annotations

import io
import json
import re
import threading
from types import SimpleNamespace

import pytest

from edgespec.chat.history import ChatStore
from edgespec.chat.repl import Repl
from edgespec.chat.session import ChatSession, Command, parse_command, speedup
from edgespec.engine import parse_draft_len
from edgespec.errors import ContextOverflowError, EdgespecError, InvalidParameterError
from edgespec.events import Chunk, Finished, Span, Stats
from edgespec.sampling import SamplingParams


class FakeRuntime:
    """Replies with ``pieces``, one chunk per piece, every other piece an accepted draft token.

    One token per character of the rendered messages, so context arithmetic is easy to check.
    """

    def __init__(self, pieces=("Hel", "lo", " there"), *, n_ctx: int = 4096, fail: Exception | None = None):
        self.pieces = pieces
        self.context_size = n_ctx
        self.context_used = 0
        self.draft_len: int | str = "auto"
        self.target = SimpleNamespace(name="fake-target", n_ctx=n_ctx)
        self.draft = None
        self.engine = SimpleNamespace(max_gamma=8)
        self.fail = fail
        self.requests: list[tuple[list[int], SamplingParams]] = []
        self.after_chunk = threading.Event()  # set after each chunk (tests cancel there)

    def render_chat(self, messages):
        return [0] * sum(len(m["content"]) + 4 for m in messages)

    def set_draft_len(self, draft_len):
        self.draft_len = draft_len

    def stream(self, prompt, params, *, cancel=None):
        self.requests.append((prompt, params))
        return self._events(cancel)

    def _events(self, cancel):
        if self.fail is not None:
            raise self.fail
        text, stats = "", Stats()
        for i, piece in enumerate(self.pieces):
            if cancel is not None and cancel.is_set():
                yield Finished(text, (), "cancelled", stats)
                return
            from_draft = i % 2 == 0
            stats = Stats(generated=i + 1, rounds=i + 1, drafted=i + 1, accepted=(i + 2) // 2)
            text += piece
            yield Chunk(piece, (i,), (from_draft,), (Span(piece, from_draft),), stats)
        yield Finished(text, tuple(range(len(self.pieces))), "eos", stats)


def _session(tmp_path, runtime=None, **params) -> ChatSession:
    return ChatSession(runtime or FakeRuntime(), SamplingParams(**params), ChatStore(tmp_path))


def _saved(session: ChatSession) -> dict:
    return json.loads(session.store.path(session.conversation.id).read_text())



def test_speedup_counts_the_rounds_not_the_time_a_consumer_held_the_stream():
    # 50 tokens whose rounds took 1 s at a plain rate of 50 tok/s: no gain, no loss, although the consumer (a UI
    # drawing each chunk) stretched the wall time to 1.25 s.
    stats = Stats(generated=50, t_prefill=0.5, t_total=1.75, t_draft=0.01, t_verify=0.97, t_sample=0.02,
                  plain_tokens_per_second=50.0)
    assert speedup(stats) == pytest.approx(1.0)
    assert stats.tokens_per_second == pytest.approx(40.0)
    assert speedup(Stats(generated=5, t_verify=0.1)) is None  # plain rate not measured yet

@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("hello", None),
        ("/usr/bin is a directory", None),  # a path, not a command
        ("/temp 0.7", Command("temp", "0.7")),
        ("  /DRAFT off ", Command("draft", "off")),
        ("/clear", Command("clear", "")),
        ("/quit", Command("quit", "")),
    ],
)
def test_parse_command(line, expected):
    assert parse_command(line) == expected


def test_unknown_command_is_an_error_not_a_message():
    with pytest.raises(EdgespecError, match="unknown command /tmep"):
        parse_command("/tmep 0.3")


@pytest.mark.parametrize(("value", "expected"), [("auto", "auto"), ("off", 0), ("0", 0), ("5", 5), (" AUTO ", "auto")])
def test_parse_draft_len(value, expected):
    assert parse_draft_len(value) == expected


@pytest.mark.parametrize("value", ["65", "-1", "fast", ""])
def test_parse_draft_len_rejects(value):
    with pytest.raises(InvalidParameterError):
        parse_draft_len(value)


def test_a_turn_is_streamed_recorded_and_saved(tmp_path):
    session = _session(tmp_path)
    events = list(session.reply("hi"))
    assert isinstance(events[-1], Finished) and events[-1].text == "Hello there"
    user, answer = session.conversation.messages
    assert (user.role, user.content) == ("user", "hi")
    assert answer.content == "Hello there" and answer.finish_reason == "eos"
    assert answer.spans == [("Hel", True), ("lo", False), (" there", True)]
    assert answer.stats["accepted"] == 2
    saved = _saved(session)
    assert [m["content"] for m in saved["messages"]] == ["hi", "Hello there"]
    assert session.session_rate() == pytest.approx(2 / 3)


def test_stopping_keeps_and_saves_the_partial_reply(tmp_path):
    session = _session(tmp_path)
    cancel = threading.Event()
    for event in session.reply("hi", cancel):
        if isinstance(event, Chunk):
            cancel.set()  # stop after the first chunk
    answer = session.conversation.messages[-1]
    assert (answer.content, answer.finish_reason) == ("Hel", "cancelled")
    assert _saved(session)["messages"][-1]["content"] == "Hel"


def test_closing_the_stream_early_saves_what_was_shown(tmp_path):
    session = _session(tmp_path)
    events = session.reply("hi")
    next(events)
    events.close()  # the view went away (quit, crash) mid-reply
    assert _saved(session)["messages"][-1] == {
        "role": "assistant",
        "content": "Hel",
        "spans": [["Hel", True]],
        "finish_reason": "cancelled",
        "stats": Stats(generated=1, rounds=1, drafted=1, accepted=1).as_dict(),
    }


def test_an_error_before_the_reply_takes_the_message_back(tmp_path):
    session = _session(tmp_path, FakeRuntime(fail=EdgespecError("busy")))
    with pytest.raises(EdgespecError, match="busy"):
        list(session.reply("hi"))
    assert session.conversation.messages == []


def test_max_tokens_is_cut_to_the_room_left_and_a_full_context_is_an_error(tmp_path):
    runtime = FakeRuntime(n_ctx=100)
    session = _session(tmp_path, runtime, max_tokens=500)
    list(session.reply("hi"))  # 6 prompt tokens, 8 kept for drafts
    assert runtime.requests[-1][1].max_tokens == 100 - 6 - 8
    with pytest.raises(ContextOverflowError, match="/clear"):
        list(session.reply("x" * 200))
    assert [m.content for m in session.conversation.messages] == ["hi", "Hello there"]


def test_speculation_toggle_returns_to_the_previous_length(tmp_path):
    session = _session(tmp_path)
    session.set_draft_len(5)
    session.toggle_speculation()
    assert session.runtime.draft_len == 0 and not session.speculating
    session.toggle_speculation()
    assert session.runtime.draft_len == 5
    with pytest.raises(InvalidParameterError):
        session.set_draft_len(99)


def test_draft_length_changes_wait_for_the_running_reply(tmp_path):
    session = _session(tmp_path)
    events = session.reply("hi")
    next(events)
    session.set_draft_len(0)
    assert session.runtime.draft_len == "auto" and session.draft_len == 0  # pending, shown as the setting
    list(events)
    assert session.runtime.draft_len == 0


def test_apply_commands(tmp_path):
    session = _session(tmp_path)
    assert session.apply(Command("temp", "0.25")) == "temperature 0.25"
    assert session.params.temperature == 0.25
    assert session.apply(Command("draft", "off")) == "draft length off"
    assert session.apply(Command("spec")) == "speculation on (draft length auto)"
    with pytest.raises(InvalidParameterError):
        session.apply(Command("temp", "warm"))
    list(session.reply("hi"))
    old_id = session.conversation.id
    assert session.apply(Command("clear")) == "new conversation"
    assert session.conversation.id != old_id and session.conversation.messages == []
    assert session.conversation.system == session.store.load(old_id).system
    assert session.apply(Command("help")) is None  # the view's business


def test_repl_streams_replies_to_stdout_and_the_rest_to_stderr(tmp_path):
    session = _session(tmp_path)
    stdin = io.StringIO("hi\n\n/temp 0\n/draft 3\n/nope\n/stop\n/help\nagain\n/quit\nnot read\n")
    stdout, stderr = io.StringIO(), io.StringIO()
    assert Repl(session, stdin=stdin, stdout=stdout, stderr=stderr, highlight=False).run() == 0
    assert stdout.getvalue() == "Hello there\nHello there\n"
    err = stderr.getvalue()
    assert "temperature 0" in err and "draft length 3" in err
    assert "error: unknown command /nope" in err
    assert "Ctrl+C stops a reply" in err and "/draft auto|N|off" in err
    assert "[3 tokens" in err and f"--resume {session.conversation.id}" in err
    assert [m.content for m in session.conversation.messages] == ["hi", "Hello there", "again", "Hello there"]
    assert session.runtime.requests[-1][1].temperature == 0 and session.runtime.draft_len == 3


def test_repl_highlights_draft_tokens_with_ansi_when_asked(tmp_path):
    stdout = io.StringIO()
    Repl(_session(tmp_path), stdin=io.StringIO("hi\n"), stdout=stdout, stderr=io.StringIO(), highlight=True).run()
    assert stdout.getvalue() == "\x1b[32mHel\x1b[0mlo\x1b[32m there\x1b[0m\n"


# ----- the command on the tiny model -------------------------------------------------------------------------


@pytest.mark.real
def test_cli_no_tui_chat_list_and_resume(tiny_model_path, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from edgespec.cli.chat import chat

    monkeypatch.setenv("EDGESPEC_DATA", str(tmp_path))
    model = str(tiny_model_path)
    args = [
        "--target",
        model,
        "--draft",
        model,
        "--temperature",
        "0",
        "-n",
        "12",
        "--no-tui",
        "--n-ctx",
        "512",
        "-t",
        "1",
    ]
    runner = CliRunner()
    first = runner.invoke(chat, args, input="What is the capital of France?\n/quit\n")
    assert first.exit_code == 0, first.output
    assert re.search(r"\[12 tokens · [\d.]+ tok/s · ", first.stderr)  # the stats line
    assert first.stdout.strip()  # the reply
    store = ChatStore(tmp_path / "chats")
    saved = store.latest()
    assert [m.role for m in saved.messages] == ["user", "assistant"]
    assert saved.target == model and saved.draft == model

    listed = runner.invoke(chat, ["--list"])
    assert listed.exit_code == 0 and saved.id in listed.stdout

    # Resuming reloads the chat's own models when none are named.
    again = runner.invoke(
        chat, ["--resume", "--no-tui", "-n", "8", "--n-ctx", "512", "-t", "1"], input="And Germany?\n"
    )
    assert again.exit_code == 0, again.output
    assert "resumed: 2 messages" in again.stderr
    assert len(store.load(saved.id).messages) == 4


def test_cli_reports_errors_in_one_line(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from edgespec.cli.chat import chat

    monkeypatch.setenv("EDGESPEC_DATA", str(tmp_path))
    missing = CliRunner().invoke(chat, ["--target", str(tmp_path / "missing.gguf"), "--no-tui"], input="")
    assert missing.exit_code == 1
    assert missing.stderr.startswith("error: ") and "Traceback" not in missing.output
    no_chat = CliRunner().invoke(chat, ["--resume", "nope", "--no-tui"])
    assert no_chat.exit_code == 1 and "error: no saved chat 'nope'" in no_chat.stderr
