"""Every model load and decode runs on one thread, whichever thread asks (see edgespec.models.llama_thread)."""

from __future__ import annotations

import threading
from pathlib import Path

import llama_cpp
import pytest

from edgespec.models.llama_thread import on_llama_thread


def _on_thread(fn):
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(10)
    return out[0]


def test_calls_from_any_thread_run_on_one_other_thread_and_bring_back_results_and_errors() -> None:
    here = threading.get_ident()
    llama = on_llama_thread(threading.get_ident)
    assert llama != here
    assert _on_thread(lambda: on_llama_thread(threading.get_ident)) == llama
    # From the llama thread itself a call runs inline (a callback that calls back would otherwise wait forever).
    assert on_llama_thread(lambda: on_llama_thread(threading.get_ident)) == llama
    with pytest.raises(ZeroDivisionError):
        on_llama_thread(lambda: 1 / 0)
    assert on_llama_thread(lambda x, y=0: x + y, 2, y=3) == 5


@pytest.mark.real
def test_a_model_loads_and_decodes_on_the_llama_thread_whoever_calls(tiny_model_path: Path, monkeypatch) -> None:
    from edgespec.models.backend import Model

    seen: dict[str, set[int]] = {"init": set(), "decode": set()}
    init, decode = llama_cpp.llama_init_from_model, llama_cpp.llama_decode

    def watched_init(*args):
        seen["init"].add(threading.get_ident())
        return init(*args)

    def watched_decode(*args):
        seen["decode"].add(threading.get_ident())
        return decode(*args)

    monkeypatch.setattr(llama_cpp, "llama_init_from_model", watched_init)
    monkeypatch.setattr(llama_cpp, "llama_decode", watched_decode)
    llama = on_llama_thread(threading.get_ident)
    model = _on_thread(lambda: Model(tiny_model_path, n_ctx=256, n_seq=2))
    with model:
        model.decode([1, 2, 3], [2])
        _on_thread(lambda: model.slots[1].decode([4, 5], [1]))
        assert model.slots[0].kv_tokens == [1, 2, 3] and model.slots[1].kv_tokens == [4, 5]
    assert seen == {"init": {llama}, "decode": {llama}}
