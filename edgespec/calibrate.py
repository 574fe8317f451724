"""What decodes cost on this machine: measured, remembered per machine and model setup, and checked.

Before auto's first choice the engine's :class:`Calibration` times what a verify of b tokens and a draft step cost
(8.2 s for a 1.5B model on a 2-core CPU). Those costs belong to the machine, the model file and how it runs
(threads, GPU layers), not to a process, so they are kept in a small JSON file (:class:`CostCache`) and reused by
the next process of the same boot, once the first live decodes bear them out (:class:`CostCheck`); rounds keep
refining them in memory.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import re
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgespec.sampling import LOGITS, Readout

if TYPE_CHECKING:
    from edgespec.generation import Generation, Lane

log = logging.getLogger(__name__)

# One-token decodes timed after another one-token decode and after a 2-token one, to price a change of width: on the
# dev CPU the change adds 0.2-0.9 ms to a 31 ms step, so it takes a few samples of each to see it (1.1 s there).
SWITCH_SAMPLES = 5


@dataclass(frozen=True)
class Costs:
    verify: dict[int, float]  # seconds of one target decode of b tokens
    draft: dict[str, float]  # seconds per drafted token, per drafter
    catchup: dict[str, float]  # seconds per caught-up token, per drafter
    switch: float = 0.0  # extra seconds of a target decode whose width differs from the last one's (see time_switch)


def time_decodes(model: Any, token: int, width: int, repeat: int, readout: Readout | None = LOGITS) -> list[float]:
    """Seconds of each of ``repeat`` decodes of ``width`` copies of ``token`` at the model's current KV position,
    each rolled back. With a ``readout``, every row is scored that way (what a verify asks); with None, no row is
    (a catch-up)."""
    keep = len(model.kv_tokens)
    times = []
    rows = range(width) if readout is not None else ()
    for _ in range(repeat):
        t0 = time.perf_counter()
        model.decode([token] * width, rows, readout or LOGITS)
        times.append(time.perf_counter() - t0)
        model.truncate(keep)
    return times


class CostCheck:
    """Costs read from the cache, set against the first live decodes of the widths they price.

    A cache entry is trusted for the rest of the boot, but it may have been measured while the machine was busy
    (or idle, and now it is busy): a curve that is off misprices every plan until rounds have slowly pulled it
    back. The first few decodes say whether it still holds: their median ratio to the cached cost, beyond
    ``tolerance`` either way, means measuring again. Decodes on these machines spread by 7-15 % one to the next
    and drift by about 10 % over tens of seconds, so a median of a few that is off by half is no noise.
    """

    def __init__(self, verify: dict[int, float], samples: int = 4, tolerance: float = 1.5) -> None:
        self.verify = verify
        self.samples = samples
        self.tolerance = tolerance
        self.ratios: list[float] = []

    def add(self, width: int, seconds: float) -> bool | None:
        """One live decode of ``width`` tokens: None while undecided, then True (the cache holds) or False (it is off:
        measure again)."""
        cached = self.verify.get(width)
        if cached is None or cached <= 0:
            return None
        self.ratios.append(seconds / cached)
        if len(self.ratios) < self.samples:
            return None
        ratio = statistics.median(self.ratios)
        return 1 / self.tolerance <= ratio <= self.tolerance

    @property
    def ratio(self) -> float:
        """Live over cached, the median so far."""
        return statistics.median(self.ratios) if self.ratios else 1.0


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")  # Linux: a new random id at every boot


def _boot_id() -> str | None:
    try:
        return BOOT_ID.read_text(encoding="ascii").strip()[:8] or None
    except OSError:
        return None  # not Linux (or no /proc): the costs are kept across boots


def _host() -> str:
    """This host as the cache knows it across boots: its name and logical CPUs."""
    return f"{platform.node()} {os.cpu_count()}"


def time_switch(model: Any, token: int, other: int, repeat: int, readout: Readout | None = LOGITS) -> float:
    """What a one-token decode costs more right after a decode of ``other`` tokens than right after another one-token
    decode: the median of ``repeat`` of each, at the model's current KV position, every decode rolled back.

    llama.cpp reuses the last decode's compute graph only for a batch of the same shape; any other width builds it
    anew (llama-graph.cpp, ``can_reuse``: the KQ mask's rows are the batch's tokens). Measured on the 2-core dev CPU:
    +0.2-0.9 ms for a 1-token decode after one of 2, 5 or 16 tokens for the 1.5B (31 ms a step), +0.6-0.8 ms for the
    135M (9 ms); a calibration that times each width over and over never sees it."""
    after_one, after_other = [], []
    for _ in range(repeat):
        time_decodes(model, token, 1, 1, readout)
        after_one += time_decodes(model, token, 1, 1, readout)
        time_decodes(model, token, other, 1, readout)
        after_other += time_decodes(model, token, 1, 1, readout)
    return max(statistics.median(after_other) - statistics.median(after_one), 0.0)


def machine_key() -> str:
    """The part of a setup key that names this machine (every key of this machine starts with it and a space).

    On Linux it names this boot as well: a host name and a core count do not tell two virtual machines apart (the
    dev VMs here are all "vm 2", on CPUs that differ from one to the next), nor a machine whose driver or power
    settings changed across a reboot. Costs are measured again once per boot (8.2 s for a 1.5B model on a 2-core
    CPU; rounds refine them in memory from there)."""
    boot = _boot_id()
    return _host() + (f" boot={boot}" if boot else "")


def setup_key(*models: Any) -> str:
    """Identifies what the costs depend on: this machine, each model file (path, size, mtime) and how it runs."""
    parts = [machine_key()]
    for m in models:
        if m is None:
            parts.append("-")
            continue
        path = Path(str(m.path))
        stat = path.stat() if path.is_file() else None
        parts.append(
            f"{path.resolve() if stat else path}|{stat.st_size if stat else 0}|{int(stat.st_mtime) if stat else 0}"
            f"|threads={getattr(m, 'n_threads', '?')}|ngl={getattr(m, 'n_gpu_layers', 0)}"
            f"|bit_exact={getattr(m, 'bit_exact', False)}"
            # Layers on RPC servers cost a round trip per decode: each set of servers is a setup of its own.
            + (f"|rpc={','.join(m.rpc)}" if getattr(m, "rpc", ()) else "")
        )
    return " ".join(parts)


_MODEL_IN_KEY = re.compile(r"(\S[^|]*)\|\d+\|\d+\|threads=([^|]+)\|ngl=([^|]+)\|bit_exact=(\w+)")


def key_models(key: str) -> list[dict[str, Any]]:
    """The model setups a key names (file name, threads, GPU layers, bit-exact), for people to read."""
    return [
        {"file": Path(path).name, "threads": threads, "n_gpu_layers": ngl, "bit_exact": bit_exact == "True"}
        for path, threads, ngl, bit_exact in _MODEL_IN_KEY.findall(key)
    ]


@dataclass(frozen=True)
class Entry:
    key: str
    costs: Costs
    measured_at: float | None  # seconds since the epoch; None for an entry written before it was recorded


class CostCache:
    """A JSON file mapping setup keys to :class:`Costs` (and when they were measured).

    A file that cannot be used (unreadable, cut short, not JSON, not an object) or an entry that is not a set of
    costs (wrong shape, a negative or non-finite time) is only a cache: a warning says so once, the costs are
    measured again, and the next :meth:`put` writes a sound file without the bad content.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._warned = False
        self.problem: str | None = None  # what is wrong with the file, once a read found out

    def entries(self, prefix: str = "") -> list[Entry]:
        """The sound entries whose keys start with ``prefix`` (malformed ones are left out)."""
        found = []
        for key, raw in self._read().items():
            costs = _parse_costs(raw) if key.startswith(prefix) else None
            if costs is not None:
                when = raw.get("measured_at")
                found.append(Entry(key, costs, float(when) if isinstance(when, (int, float)) else None))
        return found

    def get(self, key: str) -> Costs | None:
        entry = self._read().get(key)
        if entry is None:
            return None
        costs = _parse_costs(entry)
        if costs is None:
            self._warn("holds a malformed entry for this setup")
        return costs

    def put(self, key: str, costs: Costs) -> None:
        """Store ``key``'s costs, dropping malformed entries and those this host wrote before its last boot (or
        before boots were in the key): they are never read again (see :func:`machine_key`). Other hosts' stay."""
        host, current = _host() + " ", machine_key() + " "
        data = {
            k: v
            for k, v in self._read().items()
            if _parse_costs(v) is not None and (not k.startswith(host) or k.startswith(current))
        }
        data[key] = {**asdict(costs), "measured_at": round(time.time(), 1)}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Write a temporary file and rename it: a concurrent reader sees the old file or the new one, whole.
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".costs-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1)
            os.replace(tmp, self.path)
        except OSError:
            pass  # a read-only cache only means calibrating again next time

    def _read(self) -> dict[str, Any]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}  # nothing measured yet
        except (OSError, UnicodeDecodeError) as exc:
            self._warn(f"cannot be read ({getattr(exc, 'strerror', None) or exc})")
            return {}
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            self._warn("is empty" if not text.strip() else "is not valid JSON")
            return {}
        if not isinstance(data, dict):
            self._warn("does not hold a JSON object")
            return {}
        return data

    def _warn(self, problem: str) -> None:
        self.problem = problem
        if not self._warned:  # once per cache: every round of a session reads it
            log.warning("the cost cache %s %s; measuring the costs again and rewriting it", self.path, problem)
            self._warned = True


def _parse_costs(entry: Any) -> Costs | None:
    """The costs in one cache entry, or None if it is not one (wrong shape, a time that is negative or not finite)."""
    try:
        costs = Costs(
            verify={int(b): float(s) for b, s in entry["verify"].items()},
            draft={str(d): float(s) for d, s in entry["draft"].items()},
            catchup={str(d): float(s) for d, s in entry["catchup"].items()},
            switch=float(entry.get("switch", 0.0)),
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    times = [*costs.verify.values(), *costs.draft.values(), *costs.catchup.values(), costs.switch]
    return costs if all(math.isfinite(t) and t >= 0 for t in times) else None


class Calibration:
    """The engine's costs: measured once per readout kind (or read from the cache and checked), recorded into each
    lane's auto controller.

    A CPU's verify cost grows ~linearly with b while a GPU's is nearly flat: a controller needs the curve before it
    can choose γ well, and learning it from live rounds costs those rounds.
    """

    def __init__(self, target: Any, draft: Any, max_gamma: int, lanes: list[Lane], cache: CostCache | None) -> None:
        self.target, self.draft_model, self.max_gamma = target, draft, max_gamma
        self._lanes = lanes
        self._cache = cache
        self.costs: dict[str, Costs] = {}  # by readout kind, as recorded into the lanes' controllers
        self._checks: dict[str, CostCheck] = {}  # costs read from the cache, until live decodes confirm them
        self._curve_seeded: set[str] = set()  # the readouts whose costs the shared curve has taken

    def calibrate(self, lane: Lane, ctx: list[int], readout: Readout) -> None:
        """Give the lane's controller the costs for ``readout``'s kind: this engine's earlier ones, the cache's when
        this setup was measured before, else :meth:`measure` them (the lane's KV holds ``ctx[:-1]``)."""
        costs = self.costs.get(readout.kind)
        if costs is None:
            costs = self._cache.get(self._key(readout)) if self._cache is not None else None
            if costs is not None:
                self._checks[readout.kind] = CostCheck(costs.verify)
            else:
                costs = self.measure(lane, ctx, readout)
                self._store(readout, costs)
            self.costs[readout.kind] = costs
        assert lane.auto is not None
        # The lanes' controllers share one curve of target decode costs: it takes the calibration once per
        # readout. Given again by each lane that starts, a single sequence's costs would keep pulling back what
        # the shared decodes have measured since (4 sequences' 6-row decode took 264 ms where one sequence's 6
        # tokens had taken 201 ms: see Model's note on llama.cpp's micro-batches).
        verify = {} if readout.kind in self._curve_seeded else costs.verify
        self._curve_seeded.add(readout.kind)
        lane.auto.record_costs(verify, costs.draft, costs.catchup, costs.switch)
        lane.calibrated_for = readout.kind

    def check(self, live: Sequence[Generation], seconds: float) -> None:
        """A step's verify of ``live``'s rows took ``seconds``: set a decode of one pass against the cached costs it
        was planned with; when the first few disagree beyond noise, measure every cost again on a request of this
        step and replace what the lanes hold."""
        if not self._checks:  # nothing read from the cache awaits its check: every step after the first few
            return
        kinds = {g.readout.kind for g in live}
        check = self._checks.get(next(iter(kinds))) if len(kinds) == 1 else None
        if check is None:
            return
        passes = self.target.decode_passes({g.lane.index: g.rows for g in live})
        verdict = check.add(passes[0], seconds) if len(passes) == 1 else None
        if verdict is None:
            return
        kind = kinds.pop()
        del self._checks[kind]
        on = next((g for g in live if not g.done and g.readout.kind == kind), None)
        if verdict or on is None:
            return
        log.info("the cached decode costs are %.2fx off on this machine now; measuring them again", check.ratio)
        costs = self.measure(on.lane, on.ctx, on.readout)
        self._store(on.readout, costs)
        # Every cost the lanes hold came from the cache too (the curve is shared): all of it is replaced.
        self.costs = {kind: costs}
        self._checks.clear()
        self._curve_seeded = {kind}
        for i, lane in enumerate(lane for lane in self._lanes if lane.auto is not None):
            lane.auto.forget_costs()
            lane.auto.record_costs(costs.verify if i == 0 else {}, costs.draft, costs.catchup, costs.switch)
            lane.calibrated_for = kind

    def measure(self, lane: Lane, ctx: list[int], readout: Readout) -> Costs:
        """Two decodes of every verify width at the current context position (so attention length is realistic),
        rolled back, and what a change of width adds (:func:`time_switch`); the first request's prefill time
        includes them (8.2 s for a 1.5B model on a 2-core CPU, 1.1 s of it the change of width)."""
        # Every width, because the curve is not smooth: CPU kernels work in blocks, so a 16-token decode
        # measured cheaper than a 15-token one (6.7 vs 8.5 single steps) and 8 about as cheap as 7. The faster
        # of two samples, because one delayed sample would rule a width out for good (rounds only re-measure
        # the widths they use). The plain step, the yardstick, gets three.
        pending = ctx[-1]
        target = lane.target
        fits = range(1, min(self.max_gamma + 1, self.target.n_ctx - len(ctx)) + 1)
        verify = {b: min(time_decodes(target, pending, b, 3 if b == 1 else 2, readout)) for b in fits}
        # Between 1 and 2 rows, the cheapest change (a graph costs about the same to build whatever its width).
        switch = time_switch(target, pending, 2, SWITCH_SAMPLES, readout) if 2 in verify else 0.0
        draft: dict[str, float] = {}
        catchup: dict[str, float] = {}
        if lane.draft is not None and self.draft_model is not None and len(ctx) + 32 <= self.draft_model.n_ctx:
            draft["model"] = min(time_decodes(lane.draft, pending, 1, 3, readout))
            # What bringing the draft model back after it sat out costs per missed token: a batched decode (the
            # second of two: the first builds the graph for that shape).
            catchup["model"] = time_decodes(lane.draft, pending, 32, 2, None)[-1] / 32
        return Costs(verify, draft, catchup, switch)

    def _key(self, readout: Readout) -> str:
        # By the readout's kind: what a decode costs barely depends on k, and a key per k would measure again (~4 s)
        # for every top-k a client sends.
        setup = setup_key(self.target, self.draft_model)
        return f"{setup} max_gamma={self.max_gamma} widths=all,2 readout={readout.kind}"

    def _store(self, readout: Readout, costs: Costs) -> None:
        if self._cache is not None and self.max_gamma + 1 in costs.verify:  # only a complete measurement
            self._cache.put(self._key(readout), costs)
