"""A bench run's result, its summaries per task class and strategy, and the report printed from them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgespec.bench.measure import RunRecord
from edgespec.bench.strategies import PLAIN
from edgespec.bench.tables import format_table, percentile, value_range


@dataclass
class BenchResult:
    config: dict[str, Any]
    records: list[RunRecord]

    def summaries(self) -> dict[str, dict[str, Summary]]:
        return summarize(
            self.records, greedy=self.config.get("temperature", 0) == 0, order=self.config.get("strategies")
        )

    def to_json(self) -> dict[str, Any]:
        summaries = self.summaries()
        return {
            "config": self.config,
            "summary": {t: {s: asdict(v) for s, v in row.items()} for t, row in summaries.items()},
            "overall_speedup": overall_speedup(summaries),
            "runs": [asdict(r) for r in self.records],
        }


@dataclass(frozen=True)
class Summary:
    """One strategy on one task class, over its prompts. Rates pool tokens and times: Σ tokens / Σ seconds."""

    runs: int
    generated: int
    acceptance_rate: float | None  # accepted / drafted; None when nothing was drafted
    tokens_per_verify: float
    tokens_per_second: float
    speedup: float | None  # tokens_per_second / plain's on the same prompts; None without a plain row
    p50_ms: float | None  # per-token time percentiles over every decode token of every prompt
    p95_ms: float | None
    outside_ms: float | None  # Σ t_outside / Σ generated: the loop's own (Python) ms per token; None for peers
    same_as_plain: int | None  # greedy only: runs whose output text equals plain's (of the same prompt and repeat)
    ceiling: float | None = None  # pooled speedup of the best possible lookup schedule on these outputs (greedy)
    forced_share: float = 0.0  # of the committed tokens, those a constraint forced (proposed without a drafter)
    constraint_ms: float = 0.0  # the constraint engine's ms per committed token (part of outside_ms)

    @property
    def ceiling_share(self) -> float | None:
        """How much of the lookup ceiling's gain the speedup takes, against the ceiling of these runs' own outputs;
        None without both, or where the ceiling offers nothing to take (under 1.01x)."""
        if self.speedup is None or self.ceiling is None or self.ceiling < 1.01:
            return None
        return (self.speedup - 1.0) / (self.ceiling - 1.0)


def _summary(runs: list[RunRecord], plain_rate: float | None, plain_text: dict[tuple[str, int], str] | None) -> Summary:
    drafted = sum(r.drafted for r in runs)
    rounds = sum(r.rounds for r in runs)
    t_decode = sum(r.t_decode for r in runs)
    rate = sum(r.decode_tokens for r in runs) / t_decode if t_decode > 0 else 0.0
    times = [t for r in runs for t in r.token_times]
    outside = [r.t_outside for r in runs]
    p50, p95 = percentile(times, 50), percentile(times, 95)
    return Summary(
        runs=len(runs),
        generated=sum(r.generated for r in runs),
        acceptance_rate=sum(r.accepted for r in runs) / drafted if drafted else None,
        # Peers' first token comes with their prefill, so count only decode tokens per decode round.
        tokens_per_verify=sum(r.decode_tokens for r in runs) / rounds if rounds else 0.0,
        tokens_per_second=rate,
        speedup=rate / plain_rate if plain_rate else None,
        p50_ms=p50 * 1e3 if p50 is not None else None,
        p95_ms=p95 * 1e3 if p95 is not None else None,
        outside_ms=(
            1e3 * sum(o for o in outside if o is not None) / sum(r.generated for r in runs)
            if runs and None not in outside and any(r.generated for r in runs)
            else None
        ),
        same_as_plain=(
            sum(plain_text.get((r.prompt, r.repeat)) == r.text for r in runs) if plain_text is not None else None
        ),
        ceiling=(
            sum(r.generated for r in runs) / sum(r.generated / r.ceiling for r in runs)
            if runs and all(r.ceiling for r in runs)
            else None
        ),
        forced_share=sum(r.forced for r in runs) / max(sum(r.generated for r in runs), 1),
        constraint_ms=1e3 * sum(r.t_constraint for r in runs) / max(sum(r.generated for r in runs), 1),
    )


def summarize(
    records: Sequence[RunRecord], *, greedy: bool = True, order: Sequence[str] | None = None
) -> dict[str, dict[str, Summary]]:
    """task → strategy → :class:`Summary`. Tasks come in the order the records name them, strategies in
    ``order`` (the run rotates them per prompt), else plain first and the rest as the records name them."""
    rank = {s: i for i, s in enumerate(order or ())}
    by_task: dict[str, dict[str, list[RunRecord]]] = {}
    for r in records:
        by_task.setdefault(r.task, {}).setdefault(r.strategy, []).append(r)
    out: dict[str, dict[str, Summary]] = {}
    for task, by_strategy in by_task.items():
        plain_runs = by_strategy.get(PLAIN)
        plain_rate = _summary(plain_runs, None, None).tokens_per_second if plain_runs else None
        plain_text = {(r.prompt, r.repeat): r.text for r in plain_runs} if plain_runs and greedy else None
        ordered = sorted(by_strategy, key=lambda s: (s != PLAIN, rank.get(s, len(rank))))
        out[task] = {s: _summary(by_strategy[s], plain_rate, plain_text) for s in ordered}
    return out


def overall_speedup(summaries: dict[str, dict[str, Summary]]) -> dict[str, float | None]:
    """Per strategy, the geometric mean of its per-task speedups (every task class weighs the same)."""
    strategies = list(dict.fromkeys(s for row in summaries.values() for s in row))
    out: dict[str, float | None] = {}
    for s in strategies:
        ratios = [row[s].speedup for row in summaries.values() if s in row and row[s].speedup]
        out[s] = math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else None
    return out


def sampling_paths(records: Sequence[RunRecord]) -> list[str]:
    """The sampling paths the engine runs took, in order of first use."""
    return list(dict.fromkeys(r.sampling_path for r in records if r.sampling_path))


# ----- text output ------------------------------------------------------------------------------------------
def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def render_report(result: BenchResult) -> str:
    """A table per task class, then the speedups of every strategy on every class."""
    summaries = result.summaries()
    cfg = result.config
    parts = []
    headers = ["strategy", "accept", "tok/verify", "tok/s", "speedup", "p50 ms/tok", "p95 ms/tok", "outside ms/tok"]
    greedy = cfg.get("temperature", 0) == 0
    shares = greedy and any(v.ceiling for row in summaries.values() for v in row.values())
    repeats = sorted({r.repeat for r in result.records})
    by_repeat = [
        summarize([r for r in result.records if r.repeat == k], greedy=greedy) for k in repeats
    ] if len(repeats) > 1 else []  # fmt: skip
    if greedy:
        headers.append("=plain")
    if shares:
        headers.append("of ceiling")
    if by_repeat:
        headers += ["speedup by repeat", *(["share by repeat"] if shares else [])]
    for task, row in summaries.items():
        forced = any(v.forced_share or v.constraint_ms for v in row.values())
        lines = []
        for s, v in row.items():
            cells = [
                s,
                _fmt(v.acceptance_rate, ".0%"),
                _fmt(v.tokens_per_verify, ".2f"),
                _fmt(v.tokens_per_second, ".1f"),
                _fmt(v.speedup, ".2f", "x"),
                _fmt(v.p50_ms, ".1f"),
                _fmt(v.p95_ms, ".1f"),
                _fmt(v.outside_ms, ".3f"),
            ]
            if greedy:
                cells.append(f"{v.same_as_plain}/{v.runs}")
            if shares:  # the ceiling prices lookup alone, not the tokens a constraint forces
                cells.append("-" if s == PLAIN or v.forced_share else _fmt(v.ceiling_share, ".0%"))
            if by_repeat:
                mine = [rep[task][s] for rep in by_repeat if task in rep and s in rep[task]]
                cells.append("-" if s == PLAIN else value_range([m.speedup for m in mine], ".2f", "x"))
                if shares:
                    no_share = s == PLAIN or v.forced_share
                    cells.append("-" if no_share else value_range([m.ceiling_share for m in mine], ".0%"))
            if forced:
                cells += [_fmt(v.forced_share, ".0%"), _fmt(v.constraint_ms, ".3f")]
            lines.append(cells)
        ceiling = row[PLAIN].ceiling if PLAIN in row else None
        n_prompts = len({r.prompt for r in result.records if r.task == task})
        times = f" x {len(repeats)} repeats" if by_repeat else ""
        parts.append(
            f"{task}: {n_prompts} prompt(s){times}, up to {cfg['max_tokens']} tokens\n"
            + format_table([*headers, "forced", "mask ms/tok"] if forced else headers, lines)
            + (f"\nlookup ceiling {ceiling:.2f}x" if ceiling else "")
        )
    overall = overall_speedup(summaries)
    tasks = list(summaries)
    lines = [
        [
            s,
            *(_fmt(summaries[t][s].speedup if s in summaries[t] else None, ".2f", "x") for t in tasks),
            _fmt(overall[s], ".2f", "x"),
        ]
        for s in overall
    ]
    ceilings = [summaries[t][PLAIN].ceiling if PLAIN in summaries[t] else None for t in tasks]
    if ceilings and all(ceilings):
        gm = math.exp(sum(math.log(c) for c in ceilings if c) / len(ceilings))
        lines.append(["(ceiling)", *(_fmt(c, ".2f", "x") for c in ceilings), _fmt(gm, ".2f", "x")])
    parts.append(
        "speedup vs plain (geometric mean over task classes in the last column)\n"
        + format_table(["strategy", *tasks, "all"], lines)
    )
    draft = Path(cfg["draft"]).name if cfg["draft"] else "none"
    notes = [
        f"target {Path(cfg['target']).name}, draft {draft}, temperature {cfg['temperature']}, "
        f"{cfg['n_threads']} threads, lookup γ={cfg['lookup_len']}"
        + (", bit-exact" if cfg.get("bit_exact") else ""),
        f"sampling: {', '.join(paths) if (paths := sampling_paths(result.records)) else '-'}; outside ms/tok: the "
        "decode time per committed token spent outside llama.cpp's forward passes (the Python loop)",
    ]
    if any(v.forced_share or v.constraint_ms for row in summaries.values() for v in row.values()):
        notes.append(
            "forced: the share of committed tokens the output's constraint forced (single allowed tokens, proposed "
            "without a drafter and accepted surely); mask ms/tok: of outside ms/tok, the constraint engine's "
            "(llguidance's masks and state); constrained prompts: every strategy decodes under the same constraint, "
            "and llama-cpp-python's loops are not run on them"
        )
    if greedy:
        notes.append(
            "=plain: runs whose output equals plain decoding's (greedy; a near-tie can flip under a batched verify)"
        )
        if any(ceilings):
            notes.append(
                "lookup ceiling: the speedup of the best possible lookup schedule on plain's output (drafting exactly "
                f"as far as each proposal agrees, γ ≤ {cfg.get('ceiling_max_gamma')}) at the decode costs measured "
                f"right before and after its class{' (each repeat)' if by_repeat else ''}: no lookup controller can "
                "beat it" + _drift(cfg)
            )
        if shares:
            notes.append(
                "of ceiling: the share of the lookup ceiling's gain a strategy's speedup takes, the ceiling computed "
                "on that strategy's own outputs (plain's where =plain is full)"
            )
    if by_repeat:
        notes.append(
            f"{len(repeats)} repeats of each class, pooled (tokens over seconds); by repeat: the lowest and highest of "
            "the repeats' own speedups (and shares of the ceiling), each against plain in the same repeat"
        )
    return "\n\n".join(parts) + "\n\n" + "\n".join(notes)


def _drift(cfg: dict[str, Any]) -> str:
    """How far the priced costs moved over the run, as the widest decode's cost in single steps (a config from
    before they were recorded: nothing)."""
    curves = cfg.get("ceiling_costs") or []
    widest = max(curves[0], key=int) if curves else "1"
    ratios = [c[widest] / c["1"] for c in curves if c["1"] > 0] if widest != "1" else []
    if not ratios:
        return ""
    spread = f"{min(ratios):.2f}" if len(ratios) == 1 else f"{min(ratios):.2f}-{max(ratios):.2f}"
    return f" (a {widest}-token decode at {spread} single steps across {len(ratios)} measurements)"
