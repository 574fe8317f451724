"""The concurrency bench's report: a row per (level, class, strategy) of :mod:`edgespec.bench.load`'s records, ratios
to plain pooled over the rounds, and the records as JSON."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edgespec.bench.load import LoadRecord
from edgespec.bench.strategies import PLAIN
from edgespec.bench.tables import format_table, value_range


def _pooled(records: Sequence[LoadRecord]) -> LoadRecord:
    """Several runs as one: their requests together over their summed wall time."""
    first = records[0]
    merged = LoadRecord(first.level, first.task, first.strategy, sum(r.wall for r in records))
    merged.requests = [q for r in records for q in r.requests]
    return merged


def render_load_report(records: Sequence[LoadRecord], notes: Sequence[str], header: str) -> str:
    """A row per (level, class, strategy), and an "all" row per (level, strategy); ratios to plain at the same
    level, pooled over the rounds, with the range of the rounds' own ratios when there were several."""
    rows: list[list[str]] = []
    by_level: dict[int, dict[str, list[LoadRecord]]] = {}
    for r in records:
        by_level.setdefault(r.level, {}).setdefault(r.strategy, []).append(r)
    rounds = len({r.round for r in records})
    for level, strategies in by_level.items():
        tasks = list(dict.fromkeys(r.task for rs in strategies.values() for r in rs))
        plain_runs = strategies.get(PLAIN, [])
        for task in [*tasks, "all"]:
            for strategy, rs in strategies.items():
                chosen = rs if task == "all" else [r for r in rs if r.task == task]
                if not chosen:
                    continue
                merged = _pooled(chosen)
                plain = plain_runs if task == "all" else [r for r in plain_runs if r.task == task]
                ratio = merged.total_rate / _pooled(plain).total_rate if plain and _pooled(plain).total_rate else None
                spread = "-"
                if rounds > 1 and strategy != PLAIN and ratio is not None:
                    per_round = []
                    for k in sorted({r.round for r in chosen}):
                        mine = [r for r in chosen if r.round == k]
                        base = _pooled([r for r in plain if r.round == k] or plain).total_rate
                        per_round.append(_pooled(mine).total_rate / base if base else 0.0)
                    spread = value_range(per_round, ".2f") if len(per_round) > 1 else "-"
                p50, p95, acc = merged.ttft(50), merged.ttft(95), merged.acceptance
                row = [
                    str(level), task, strategy, str(len(merged.requests)), f"{merged.total_rate:.1f}",
                    f"{merged.per_request_rate:.1f}", "-" if p50 is None else f"{p50:.2f}",
                    "-" if p95 is None else f"{p95:.2f}", "-" if acc is None else f"{acc:.0%}",
                    "-" if ratio is None else f"{ratio:.2f}x",
                ]  # fmt: skip
                rows.append([*row, *([spread] if rounds > 1 else []), merged.sampling_path or "-"])
    table = format_table(
        ["N", "task", "strategy", "reqs", "total tok/s", "per-req tok/s", "TTFT p50 s", "TTFT p95 s", "accept",
         "vs plain", *([f"rounds ({rounds})"] if rounds > 1 else []), "sampling"],
        rows,
    )  # fmt: skip
    return "\n".join([header, table, *(f"note: {n}" for n in notes)])


def records_json(records: Sequence[LoadRecord]) -> list[dict[str, Any]]:
    return [
        dict(
            level=r.level, task=r.task, strategy=r.strategy, wall=r.wall, generated=r.generated,
            total_tokens_per_second=r.total_rate, per_request_tokens_per_second=r.per_request_rate,
            ttft_p50=r.ttft(50), ttft_p95=r.ttft(95), acceptance=r.acceptance, sampling_path=r.sampling_path,
            round=r.round, requests=[r.__dict__ for r in r.requests],
        )  # fmt: skip
        for r in records
    ]
