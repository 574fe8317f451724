"""Saved chats: locations, round trips, listing and lookup (no model needed)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from edgespec.chat.history import ChatStore, Conversation, Message, data_dir, merge_spans
from edgespec.errors import EdgespecError


def _chat(first: str, reply: str = "ok") -> Conversation:
    return Conversation(
        system="be brief",
        target="t.gguf",
        draft="d.gguf",
        messages=[
            Message("user", first),
            Message("assistant", reply, spans=[(reply, True)], finish_reason="stop", stats={"generated": 1}),
        ],
    )


def test_data_dir_prefers_edgespec_data_then_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGESPEC_DATA", str(tmp_path / "d"))
    assert data_dir() == tmp_path / "d"
    assert ChatStore().root == tmp_path / "d" / "chats"
    monkeypatch.delenv("EDGESPEC_DATA")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert data_dir() == tmp_path / "xdg" / "edgespec"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert data_dir() == Path.home() / ".local" / "share" / "edgespec"


def test_save_and_load_round_trip(tmp_path):
    store = ChatStore(tmp_path / "chats")
    chat = _chat("hello there")
    path = store.save(chat)
    assert path == tmp_path / "chats" / f"{chat.id}.json"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # the temporary file was renamed, not left
    loaded = store.load(chat.id)
    assert loaded == chat
    data = json.loads(path.read_text())
    assert data["messages"][1]["spans"] == [["ok", True]]
    assert "spans" not in data["messages"][0]  # user messages stay small


def test_for_model_puts_the_system_prompt_first_and_drops_extras():
    chat = _chat("hi", "hello")
    assert chat.for_model() == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]
    assert Conversation(messages=[Message("user", "x")]).for_model() == [{"role": "user", "content": "x"}]


def test_list_latest_and_prefix_lookup(tmp_path):
    store = ChatStore(tmp_path)
    assert store.list() == []
    with pytest.raises(EdgespecError, match="no saved chats"):
        store.latest()
    old, new = _chat("first question"), _chat("second question")
    old.id, new.id = "20240101-000000-aaaa", "20240102-000000-bbbb"
    store.save(old)
    store.save(new)
    past = time.time() - 100
    os.utime(store.path(old.id), (past, past))

    assert [s.id for s in store.list()] == [new.id, old.id]
    assert store.list()[0].title == "second question"
    assert store.list()[0].n_messages == 2
    assert store.latest().id == new.id
    assert store.load("20240101").id == old.id
    with pytest.raises(EdgespecError, match="2 saved chats match"):
        store.load("2024")
    with pytest.raises(EdgespecError, match="no saved chat 'zzz'"):
        store.load("zzz")
    assert store.set_aside == []


# ---------------------------------------------------------------------------------------------- damaged files

CORRUPT = {
    "empty": b"",
    "cut short": b'{"version": 1, "id": "x", "messages": [{"role": "user", "content": "hel',
    "not utf-8": b'{"version": 1, "id": "x\xff", "messages": []}',
    "a list": b"[1, 2, 3]",
    "no id": b'{"version": 1, "messages": []}',
    "bad role": b'{"version": 1, "id": "x", "messages": [{"role": "robot", "content": "hi"}]}',
    "bad spans": b'{"version": 1, "id": "x", "messages": [{"role": "assistant", "content": "a", "spans": [1]}]}',
    "messages not a list": b'{"version": 1, "id": "x", "messages": {"role": "user"}}',
    "nested too deep": b"[" * 100_000 + b"]" * 100_000,
}


@pytest.mark.parametrize("kind", sorted(CORRUPT))
def test_a_corrupt_chat_is_moved_aside_and_reported_never_dropped(tmp_path, kind):
    store = ChatStore(tmp_path)
    good = _chat("keep me")
    store.save(good)
    bad = tmp_path / "20990101-000000-dead.json"  # the newest name: `latest` meets it first
    bad.write_bytes(CORRUPT[kind])

    assert [c.id for c in store.list()] == [good.id]
    assert not bad.exists()
    moved = tmp_path / "20990101-000000-dead.json.corrupt"
    assert moved.read_bytes() == CORRUPT[kind]  # every byte kept for the user
    [note] = store.set_aside
    assert note.path == bad and note.moved_to == moved
    assert "\n" not in str(note) and "is corrupt" in str(note) and moved.name in str(note)


def test_loading_a_corrupt_chat_says_where_it_went(tmp_path):
    store = ChatStore(tmp_path)
    (tmp_path / "20240101-000000-beef.json").write_text("{not json")
    with pytest.raises(EdgespecError) as exc:
        store.load("20240101")
    message = str(exc.value)
    assert "20240101-000000-beef.json is corrupt (not JSON: " in message
    assert "moved it to 20240101-000000-beef.json.corrupt" in message
    with pytest.raises(EdgespecError, match="no saved chats"):
        store.latest()  # nothing else to resume, and the corrupt file is not offered again


def test_latest_passes_over_a_corrupt_newest_chat(tmp_path):
    store = ChatStore(tmp_path)
    good = _chat("older but fine")
    store.save(good)
    newest = tmp_path / "newest.json"
    newest.write_text('{"version": 1, "id": 7}')
    future = time.time() + 100
    os.utime(newest, (future, future))
    assert store.latest().id == good.id
    assert [s.moved_to.name for s in store.set_aside] == ["newest.json.corrupt"]


def test_an_earlier_corrupt_copy_is_not_overwritten(tmp_path):
    store = ChatStore(tmp_path)
    (tmp_path / "a.json.corrupt").write_text("first")
    (tmp_path / "a.json").write_text("second")
    store.list()
    assert (tmp_path / "a.json.corrupt").read_text() == "first"
    assert (tmp_path / "a.json.corrupt.1").read_text() == "second"


def test_files_it_cannot_judge_are_left_alone(tmp_path):
    store = ChatStore(tmp_path)
    newer = tmp_path / "from-the-future.json"
    newer.write_text('{"version": 99, "id": "from-the-future", "messages": [], "threads": {}}')
    (tmp_path / "a-directory.json").mkdir()  # unreadable as a file (as a file without permission would be)
    assert store.list() == []
    assert newer.exists() and (tmp_path / "a-directory.json").is_dir()
    reasons = sorted(str(s) for s in store.set_aside)
    assert len(reasons) == 2 and all("left as it is" in r for r in reasons)
    assert any("written by a newer edgespec (format 99" in r for r in reasons)
    with pytest.raises(EdgespecError, match="newer edgespec"):
        store.load("from-the-future")
    assert newer.exists()


def test_chat_cli_reports_set_aside_files(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from edgespec.cli import main

    monkeypatch.setenv("EDGESPEC_DATA", str(tmp_path))
    store = ChatStore(tmp_path / "chats")
    good = _chat("still here")
    store.save(good)
    (tmp_path / "chats" / "20990101-000000-dead.json").write_text("{oops")

    listed = CliRunner().invoke(main, ["chat", "--list"])
    assert listed.exit_code == 0
    assert good.id in listed.stdout
    assert "warning: saved chat " in listed.stderr and "moved it to 20990101-000000-dead.json.corrupt" in listed.stderr

    (tmp_path / "chats" / "20990102-000000-dead.json").write_text("")
    resumed = CliRunner().invoke(main, ["chat", "--resume", "20990102"])
    assert resumed.exit_code == 1
    assert resumed.stderr.count("\n") == 1 and resumed.stderr.startswith("error: saved chat ")
    assert "is corrupt (empty); moved it to 20990102-000000-dead.json.corrupt" in resumed.stderr


def test_title_is_one_short_line():
    assert Conversation().title == "(empty)"
    long = Conversation(messages=[Message("user", "word\n" * 40)])
    assert "\n" not in long.title
    assert len(long.title) == 61 and long.title.endswith("…")


def test_merge_spans_joins_runs_of_one_origin():
    assert merge_spans([("a", True), ("b", True), ("", False), ("c", False), ("d", True)]) == [
        ("ab", True),
        ("c", False),
        ("d", True),
    ]
