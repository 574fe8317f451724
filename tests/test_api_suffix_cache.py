"""The Python API's suffix cache: its modes, its bound, and the file a runtime starts from and saves to."""

from __future__ import annotations

import logging

import pytest
from fakes import FakeModel

from edgespec.api import GLOBAL_SCOPE, Runtime, SuffixCacheFile, load, suffix_cache_for
from edgespec.engine import Engine
from edgespec.errors import InvalidParameterError
from edgespec.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=30)
PROMPT = [3, 5, 7, 9, 11, 13]


@pytest.fixture
def vocabulary(monkeypatch: pytest.MonkeyPatch) -> str:
    """The fingerprint every target has here (no GGUF to read)."""
    monkeypatch.setattr("edgespec.models.vocab.fingerprint", lambda meta: "vocab-a")
    return "vocab-a"


def runtime(mode: str = "global", tokens: int = 1000, path=None) -> Runtime:
    cache, scope, file = suffix_cache_for(mode, tokens, path, None)
    engine = Engine(FakeModel(n_vocab=40, eos_bias=-9), None, draft_len=4, suffix_cache=cache, cache_scope=scope)
    return Runtime(engine, suffix_cache_file=file)


def from_cache(rt: Runtime, **kwargs) -> int:
    """Rounds of a greedy request that drafted from the suffix cache."""
    return sum(c.stats.drafter == "cache" for c in rt.stream(PROMPT, GREEDY, **kwargs))


def test_global_mode_is_one_scope_for_the_runtime_and_off_has_no_cache() -> None:
    rt = runtime("global")
    assert rt.engine.cache_scope == GLOBAL_SCOPE and rt.engine.suffix_cache.max_tokens == 1000
    assert from_cache(rt) == 0 and from_cache(rt) >= 3
    off = runtime("off")
    assert off.engine.suffix_cache is None and from_cache(off) == from_cache(off) == 0


def test_key_mode_drafts_only_for_requests_of_the_same_scope() -> None:
    rt = runtime("key")
    assert from_cache(rt) == from_cache(rt) == 0  # a request given no scope leaves the cache alone
    assert rt.engine.suffix_cache.tokens == 0
    assert from_cache(rt, cache_scope="a") == 0 and from_cache(rt, cache_scope="b") == 0
    assert from_cache(rt, cache_scope="a") >= 3


def test_bad_settings_fail_before_any_model_loads() -> None:
    with pytest.raises(InvalidParameterError, match="suffix_cache must be one of global, key, off"):
        load("no-such-model", suffix_cache="sometimes")
    with pytest.raises(InvalidParameterError, match="suffix_cache_tokens must be >= 1"):
        load("no-such-model", suffix_cache_tokens=0)


def test_a_runtime_saves_its_cache_on_close_and_the_next_one_starts_warm(tmp_path, vocabulary) -> None:
    path = tmp_path / "cache" / "qwen.npz"
    first = runtime(path=path)
    from_cache(first)
    first.close()
    assert path.exists()
    second = runtime(path=path)
    assert len(second.engine.suffix_cache) == 1 and from_cache(second) >= 3


def test_a_damaged_file_or_one_of_another_vocabulary_is_reported_and_the_cache_starts_empty(
    tmp_path, vocabulary, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "qwen.npz"
    path.write_bytes(b"not a cache")
    with caplog.at_level(logging.WARNING, logger="edgespec.api"):
        rt = runtime(path=path)
    assert "not a readable suffix cache" in caplog.text and "starting empty" in caplog.text
    assert len(rt.engine.suffix_cache) == 0
    from_cache(rt)
    rt.close()  # the damaged file is replaced
    monkeypatch.setattr("edgespec.models.vocab.fingerprint", lambda meta: "vocab-b")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="edgespec.api"):
        other = runtime(path=path)
    assert "a suffix cache of model 'vocab-a', not 'vocab-b'" in caplog.text and len(other.engine.suffix_cache) == 0


def test_a_cache_that_cannot_be_saved_is_reported_and_closing_goes_on(tmp_path, caplog) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    file = SuffixCacheFile(blocked / "cache.npz", "vocab-a")  # its folder is a file
    rt = runtime()
    rt.suffix_cache_file = file
    from_cache(rt)
    with caplog.at_level(logging.WARNING, logger="edgespec.api"):
        rt.close()
    assert "the suffix cache was not saved" in caplog.text


def test_a_real_runtime_keeps_its_cache_on_disk_for_its_vocabulary(tiny_model_path, tmp_path) -> None:
    path = tmp_path / "tiny.npz"
    params = SamplingParams(temperature=0, max_tokens=24)
    with load(tiny_model_path, n_ctx=512, n_gpu_layers=0, suffix_cache_path=path) as rt:
        rt.generate("def add(a, b):", params)
        again = rt.generate("def add(a, b):", params)
    assert path.exists()
    with load(tiny_model_path, n_ctx=512, n_gpu_layers=0, suffix_cache_path=path) as rt:
        assert len(rt.engine.suffix_cache) == 2
        assert rt.generate("def add(a, b):", params).text == again.text
