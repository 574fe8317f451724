"""The cost cache is only a cache: whatever is in the file, a warning and a rebuild, never an error."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from edgespec.calibrate import CostCache, Costs, key_models, setup_key

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
    with caplog.at_level(logging.WARNING, logger="edgespec.calibrate"):
        assert cache.get(KEY) is None
        assert cache.get(KEY) is None
        cache.put(KEY, COSTS)
    [warning] = caplog.records  # once, however often the engine asks
    assert str(path) in warning.getMessage() and "measuring the costs again" in warning.getMessage()
    written = json.loads(path.read_text())
    assert isinstance(written[KEY].pop("measured_at"), float)
    assert written == {KEY: {"verify": {"1": 0.01, "2": 0.018}, "draft": {"model": 0.006},
                             "catchup": {"model": 0.004}, "switch": 0.0}}  # fmt: skip


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
    with caplog.at_level(logging.WARNING, logger="edgespec.calibrate"):
        assert cache.get(KEY) is None
    assert "malformed entry" in caplog.text
    assert cache.get("other setup") == Costs(verify={1: 0.5}, draft={}, catchup={})  # the rest is kept
    cache.put("third setup", COSTS)
    assert set(json.loads(path.read_text())) == {"other setup", "third setup"}


def test_an_unreadable_cache_only_means_measuring_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "costs.json"
    path.mkdir()  # not a file: cannot be read, cannot be replaced
    cache = CostCache(path)
    with caplog.at_level(logging.WARNING, logger="edgespec.calibrate"):
        assert cache.get(KEY) is None
        cache.put(KEY, COSTS)  # no error: the costs stay in memory for this run
    assert "cannot be read" in caplog.text and path.is_dir()


def test_costs_are_measured_again_after_a_reboot_and_the_old_boots_entries_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A host name and a core count name many VMs alike ("vm 2"): a curve measured on the last one must not stand for
    # this one's. The key names the boot; a put drops what this host wrote before it, and leaves other hosts' alone.
    import edgespec.calibrate as costs_module

    boot_id = tmp_path / "boot_id"
    monkeypatch.setattr(costs_module, "BOOT_ID", boot_id)
    monkeypatch.setattr(costs_module.platform, "node", lambda: "vm")
    boot_id.write_text("1c5a3e9d-0f1b-4a53-9b9e-3d1f2f6a7b80\n")
    first = costs_module.machine_key()
    assert first.startswith("vm ") and first.endswith(" boot=1c5a3e9d")
    path = tmp_path / "costs.json"
    cache = CostCache(path)
    cache.put(f"{first} model-a", COSTS)
    cache.put("another-host 8 boot=00000000 model-a", COSTS)
    cache.put(f"vm {costs_module.os.cpu_count()} model-a", COSTS)  # written before boots were in the key
    assert cache.get(f"{first} model-a") == COSTS

    boot_id.write_text("77e0c2aa-5d7c-4c55-8d0b-0a0f9c7e1d22\n")  # a reboot (or another VM of the same name)
    second = costs_module.machine_key()
    assert second != first and cache.get(f"{second} model-a") is None  # measured again
    cache.put(f"{second} model-a", COSTS)
    assert set(json.loads(path.read_text())) == {f"{second} model-a", "another-host 8 boot=00000000 model-a"}

    boot_id.unlink()  # no boot id to read (not Linux): the host alone, kept across boots
    assert costs_module.machine_key() == f"vm {costs_module.os.cpu_count()}"


# ----- cached costs checked against live decodes --------------------------------------------------------------
def test_a_cost_check_decides_on_the_median_of_its_samples() -> None:
    from edgespec.calibrate import CostCheck

    holds = CostCheck({1: 0.010, 4: 0.020})
    assert holds.add(9, 1.0) is None  # a width the cache does not price says nothing
    assert [holds.add(1, s) for s in (0.011, 0.030, 0.009)] == [None, None, None]
    assert holds.add(4, 0.021) is True  # one slow decode among four is no new cost level
    off = CostCheck({1: 0.010})
    assert [off.add(1, 0.020) for _ in range(4)] == [None, None, None, False]
    assert off.ratio == pytest.approx(2.0)


def _widths_until_a_calibration(decode_calls: list[tuple[int, int]]) -> int | None:
    """How many decodes came before the first calibration: three one-token decodes, then two of two tokens."""
    widths = [n for n, _ in decode_calls]
    return next((i for i in range(len(widths)) if widths[i : i + 5] == [1, 1, 1, 2, 2]), None)


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_a_cached_curve_that_is_off_is_measured_again_within_the_first_rounds(tmp_path: Path, factor: float) -> None:
    from fakes import FakeModel

    from edgespec.engine import Engine
    from edgespec.sampling import SamplingParams

    delay = 0.004  # each fake decode sleeps this long, whatever its width: the true cost
    params = SamplingParams(temperature=0, max_tokens=24)
    cache = CostCache(tmp_path / "costs.json")
    list(Engine(FakeModel(eos_bias=-9, delay=delay), None, cost_cache=cache).stream([3, 5, 7, 5, 3], params))
    (entry,) = cache.entries()
    doctored = {b: factor * delay for b in entry.costs.verify}
    cache.put(entry.key, Costs(doctored, entry.costs.draft, entry.costs.catchup, 0.0))

    target = FakeModel(eos_bias=-9, delay=delay)
    engine = Engine(target, None, cost_cache=cache)
    *_, done = engine.stream([3, 5, 7, 5, 3], params)
    assert done.stats.generated == 24
    # The prefill, four rounds set against the cache, then the calibration.
    assert _widths_until_a_calibration(target.decode_calls) == 5
    (entry,) = cache.entries()
    assert entry.costs.verify[1] >= delay  # what a decode costs now, not the doctored figure
    assert engine._lanes[0].auto.verify_cost.curve(2)[1] >= delay  # and what the plans price


def test_a_cached_curve_that_holds_is_not_measured_again(tmp_path: Path) -> None:
    from fakes import FakeModel

    from edgespec.engine import Engine
    from edgespec.sampling import SamplingParams

    delay = 0.004
    params = SamplingParams(temperature=0, max_tokens=24)
    cache = CostCache(tmp_path / "costs.json")
    list(Engine(FakeModel(eos_bias=-9, delay=delay), None, cost_cache=cache).stream([3, 5, 7, 5, 3], params))
    (entry,) = cache.entries()
    cache.put(entry.key, Costs({b: 1.1 * delay for b in entry.costs.verify}, entry.costs.draft, {}, 0.0))
    target = FakeModel(eos_bias=-9, delay=delay)
    list(Engine(target, None, cost_cache=cache).stream([3, 5, 7, 5, 3], params))
    assert _widths_until_a_calibration(target.decode_calls) is None


def test_tests_keep_their_costs_out_of_the_users_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # tests/conftest.py points EDGESPEC_STATE at a folder of the run's own; the runtime keeps its costs there.
    from edgespec.paths import cost_cache_path, model_cache_dir

    assert not cost_cache_path().is_relative_to(model_cache_dir())
    monkeypatch.setenv("EDGESPEC_STATE", str(tmp_path))
    assert cost_cache_path() == tmp_path / ".costs.json"
    monkeypatch.delenv("EDGESPEC_STATE")
    assert cost_cache_path() == model_cache_dir() / ".costs.json"


def test_a_model_on_rpc_servers_is_a_setup_of_its_own(tmp_path: Path) -> None:
    from types import SimpleNamespace

    weights = tmp_path / "m.gguf"
    weights.write_bytes(b"GGUF")
    here = SimpleNamespace(path=weights, n_threads=2, n_gpu_layers=-1, bit_exact=False, rpc=())
    keys = {setup_key(here)} | {setup_key(SimpleNamespace(**{**vars(here), "rpc": r})) for r in (("a:1",), ("b:2",))}
    assert len(keys) == 3  # a round trip per decode: the costs of one set of servers are not another's
    assert key_models(setup_key(SimpleNamespace(**{**vars(here), "rpc": ("a:1",)})))[0]["file"] == "m.gguf"
