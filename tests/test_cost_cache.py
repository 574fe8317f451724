"""The cost cache is only a cache: whatever is in the file, a warning and a rebuild, never an error."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from edgespec.drafters.costs import CostCache, Costs

COSTS = Costs(verify={1: 0.01, 2: 0.018}, draft={"model": 0.006}, catchup={"model": 0.004})
KEY = "machine model setup"


def test_round_trip(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = CostCache(tmp_path / "costs.json")
    assert cache.get(KEY) is None  # no file yet: nothing to say
    cache.put(KEY, COSTS)
    assert CostCache(tmp_path / "costs.json").get(KEY) == COSTS
    assert caplog.records == []


DAMAGED = {
    "empty": b"",
    "cut short": b'{"machine model setup": {"verify": {"1": 0.0',
    "not utf-8": b'{"\xff": 1}',
    "a list": b"[1, 2]",
    "nested too deep": b"[" * 100_000 + b"]" * 100_000,
}


@pytest.mark.parametrize("kind", sorted(DAMAGED))
def test_a_damaged_file_is_warned_about_once_and_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    path = tmp_path / "costs.json"
    path.write_bytes(DAMAGED[kind])
    cache = CostCache(path)
    with caplog.at_level(logging.WARNING, logger="edgespec.drafters.costs"):
        assert cache.get(KEY) is None
        assert cache.get(KEY) is None
        cache.put(KEY, COSTS)
    [warning] = caplog.records  # once, however often the engine asks
    assert str(path) in warning.getMessage() and "measuring the costs again" in warning.getMessage()
    written = json.loads(path.read_text())
    assert isinstance(written[KEY].pop("measured_at"), float)
    assert written == {KEY: {"verify": {"1": 0.01, "2": 0.018}, "draft": {"model": 0.006},
                             "catchup": {"model": 0.004}}}  # fmt: skip


@pytest.mark.parametrize(
    "entry",
    [
        "not an object",
        {"verify": {"1": 0.01}},  # no draft, no catchup
        {"verify": {"one": 0.01}, "draft": {}, "catchup": {}},
        {"verify": {"1": -0.01}, "draft": {}, "catchup": {}},
        {"verify": {"1": "NaN"}, "draft": {}, "catchup": {}},
        {"verify": {"1": float("inf")}, "draft": {}, "catchup": {}},  # written as Infinity
    ],
)
def test_a_malformed_entry_is_measured_again_and_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, entry: object
) -> None:
    path = tmp_path / "costs.json"
    good = {"verify": {"1": 0.5}, "draft": {}, "catchup": {}}
    path.write_text(json.dumps({KEY: entry, "other setup": good}))
    cache = CostCache(path)
    with caplog.at_level(logging.WARNING, logger="edgespec.drafters.costs"):
        assert cache.get(KEY) is None
    assert "malformed entry" in caplog.text
    assert cache.get("other setup") == Costs(verify={1: 0.5}, draft={}, catchup={})  # the rest is kept
    cache.put("third setup", COSTS)
    assert set(json.loads(path.read_text())) == {"other setup", "third setup"}


def test_an_unreadable_cache_only_means_measuring_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "costs.json"
    path.mkdir()  # not a file: cannot be read, cannot be replaced
    cache = CostCache(path)
    with caplog.at_level(logging.WARNING, logger="edgespec.drafters.costs"):
        assert cache.get(KEY) is None
        cache.put(KEY, COSTS)  # no error: the costs stay in memory for this run
    assert "cannot be read" in caplog.text and path.is_dir()
