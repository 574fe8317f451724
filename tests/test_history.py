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
    (tmp_path / "broken.json").write_text("{not json")

    assert [s.id for s in store.list()] == [new.id, old.id]  # the unreadable file is skipped
    assert store.list()[0].title == "second question"
    assert store.list()[0].n_messages == 2
    assert store.latest().id == new.id
    assert store.load("20240101").id == old.id
    with pytest.raises(EdgespecError, match="2 saved chats match"):
        store.load("2024")
    with pytest.raises(EdgespecError, match="no saved chat 'zzz'"):
        store.load("zzz")
    with pytest.raises(EdgespecError, match="cannot read"):
        store.load("broken")


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
