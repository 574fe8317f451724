"""What every bench report is made of: text tables, ranges of values, percentiles."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), interpolating linearly between closest ranks; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell; the first column left-aligned, the rest right-aligned."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(str(c).ljust(w) if j == 0 else str(c).rjust(w) for j, (c, w) in pairs)

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]).rstrip()


def value_range(values: Sequence[float | None], spec: str, suffix: str = "") -> str:
    """``low-high`` of the values given; "-" for none, or where any is missing."""
    known = [v for v in values if v is not None]
    if not known or len(known) < len(values):
        return "-"
    return f"{format(min(known), spec)}-{format(max(known), spec)}{suffix}"
