"""Incremental detokenization: split UTF-8 characters and stop strings across token boundaries."""

from __future__ import annotations

from edgespec.text import TextStream

PIECES = {
    1: "é".encode()[:1],  # the first byte of a 2-byte character
    2: "é".encode()[1:],
    3: b"Hello",
    4: b" wor",
    5: b"ld",
    6: b"\n",
    7: b"##",
    8: b"#",
    9: "🙂".encode()[:2],
    10: "🙂".encode()[2:],
}


def feed(stream: TextStream, tokens: list[int]) -> list[str]:
    return [stream.feed(t) for t in tokens]


def test_split_utf8_character_is_emitted_whole() -> None:
    s = TextStream(PIECES.__getitem__)
    assert feed(s, [3, 1, 2, 9, 10]) == ["Hello", "", "é", "", "🙂"]
    assert s.text == "Helloé🙂"


def test_stop_string_across_tokens_is_cut_and_not_shown() -> None:
    s = TextStream(PIECES.__getitem__, stop=("world",))
    out = feed(s, [3, 4])
    assert out == ["Hello", " "]  # "wor" is held back: it may be the start of "world"
    assert s.feed(5) == "" and s.stopped_by == "world"
    assert s.text == "Hello "


def test_held_text_is_released_when_it_does_not_become_a_stop() -> None:
    s = TextStream(PIECES.__getitem__, stop=("###x",))
    assert feed(s, [7, 8]) == ["", ""]
    assert s.feed(6) == "###\n"
    assert s.stopped_by is None


def test_flush_releases_held_text_at_the_end() -> None:
    s = TextStream(PIECES.__getitem__, stop=("##!",))
    assert s.feed(7) == ""
    assert s.flush() == "##"
    assert s.text == "##"


def test_stop_inside_one_token() -> None:
    s = TextStream(PIECES.__getitem__, stop=("wo",))
    assert s.feed(4) == " " and s.stopped_by == "wo"


def test_earliest_of_several_stops_wins() -> None:
    s = TextStream({1: b"abcdef"}.__getitem__, stop=("de", "bc"))
    assert s.feed(1) == "a" and s.stopped_by == "bc"
