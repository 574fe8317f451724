"""Measured decode costs, remembered per machine and model setup.

The engine calibrates what a verify of b tokens and a draft step cost before the controller's first choice (about a
second for a 1.5B model on a 2-core CPU). Those costs belong to the machine, the model file and how it runs
(threads, GPU layers), not to a process, so they are kept in a small JSON file and reused by the next process;
rounds keep refining them in memory.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgespec.sampling import LOGITS, Readout


@dataclass(frozen=True)
class Costs:
    verify: dict[int, float]  # seconds of one target decode of b tokens
    draft: dict[str, float]  # seconds per drafted token, per drafter
    catchup: dict[str, float]  # seconds per caught-up token, per drafter


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


def setup_key(*models: Any) -> str:
    """Identifies what the costs depend on: this machine, each model file (path, size, mtime) and how it runs."""
    parts = [platform.node(), str(os.cpu_count())]
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
        )
    return " ".join(parts)


class CostCache:
    """A JSON file mapping setup keys to :class:`Costs`. Unreadable or foreign content counts as empty."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def get(self, key: str) -> Costs | None:
        entry = self._read().get(key)
        if not isinstance(entry, dict):
            return None
        try:
            return Costs(
                verify={int(b): float(s) for b, s in entry["verify"].items()},
                draft={str(d): float(s) for d, s in entry["draft"].items()},
                catchup={str(d): float(s) for d, s in entry["catchup"].items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def put(self, key: str, costs: Costs) -> None:
        data = self._read()
        data[key] = asdict(costs)
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
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}
