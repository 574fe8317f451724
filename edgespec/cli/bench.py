"""`edgespec bench`: measure decoding strategies side by side (the suite and its tables live in edgespec.bench)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from edgespec.bench.load import LLAMA_PEERS, default_levels, run_load_bench
from edgespec.bench.load_report import records_json, render_load_report
from edgespec.bench.measure import RunRecord
from edgespec.bench.probes import decode_costs, loop_costs, render_costs, render_loop_costs, width_change_cost
from edgespec.bench.report import render_report
from edgespec.bench.runner import run_bench
from edgespec.bench.strategies import DEFAULT_LOOKUP_LEN, DRAFT_N, ENGINE_STRATEGIES, PEER_STRATEGIES, parse_strategies
from edgespec.bench.workloads import load_tasks, render_prompt
from edgespec.cli.common import load_runtime, model_options, user_errors


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()] if value else []


@click.command("bench")
@model_options
@click.option(
    "--tasks",
    help="Comma-separated task classes (default: all): agent, code-edit, code-gen, creative, math, structured, "
    "summarize, translate (structured: replies held to a JSON schema or a tool call; agent: sequences of similar "
    "requests, run in order).",
)
@click.option("--max-tokens", "-n", default=128, show_default=True, help="Tokens per prompt at most.")
@click.option(
    "--prompts-per-task", type=click.IntRange(min=1), default=None, help="Use the first N prompts of each task class."
)
@click.option(
    "--strategies",
    default=",".join(ENGINE_STRATEGIES),
    show_default=True,
    help="Comma-separated: plain, draft-N, lookup, auto, auto-nocache (auto without drafts from earlier replies; "
    "plain always runs: it is the reference).",
)
@click.option(
    "--peers/--no-peers",
    default=True,
    show_default=True,
    help="Also run llama-cpp-python's Llama, plain and with LlamaPromptLookupDecoding.",
)
@click.option(
    "--lookup-len",
    type=click.IntRange(1, 64),
    default=DEFAULT_LOOKUP_LEN,
    show_default=True,
    help="γ of the fixed 'lookup' strategy and of the peer's prompt lookup.",
)
@click.option(
    "--temperature",
    "--temp",
    type=float,
    default=None,
    help="0 = greedy (the default), with top-k 40, top-p 0.95, min-p 0.05 above 0. With --loop-cost: the "
    "temperature compared with greedy (default 0.8).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for --temperature > 0.")
@click.option(
    "--workloads",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="A workload .toml (or a folder of them) instead of the shipped suite.",
)
@click.option(
    "--costs",
    is_flag=True,
    help="Only measure what one decode of k tokens costs for the target and the draft, and what a change of "
    "width adds (the numbers behind every speculation decision on this machine), and print that table.",
)
@click.option(
    "--loop-cost",
    is_flag=True,
    help="Only measure what edgespec's own loop costs beside llama.cpp: plain decoding (and the draft model at "
    "γ=4, lookup off) greedy and at --temperature, runs alternating in one process, over the first prompt of each "
    "task class; prints ms per token and per round spent outside llama.cpp's forward passes, and the same runs "
    "replayed from recorded decode outputs (the loop alone, with the caches a CPU decode evicts still warm).",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=None,
    help="How many times each class runs (default 1), each time a replicate of the whole class (auto on a fresh, "
    "newly calibrated engine, the lookup ceiling priced around it); the report pools them and gives the range of "
    "the repeats' own speedups and shares of the ceiling: a class's speedup moves by a few per cent between two "
    "runs on a shared machine. With --concurrency: rounds per class and level (default 1; the strategies' order "
    "rotates each round; the peers and the one-request-at-a-time references run in the first round only). With "
    "--loop-cost: repetitions (default 3).",
)
@click.option(
    "--with-penalties-logprobs",
    is_flag=True,
    help="With --loop-cost: also run each configuration with a repeat penalty (1.1), frequency and presence "
    "penalties (0.5) and logprobs (5 alternatives), side by side with the plain settings.",
)
@click.option(
    "--concurrency",
    metavar="N[,N...]",
    default=None,
    help="Instead of one request at a time: for each level N, N clients send the suite's prompts at once (a "
    "closed loop per task class) to one engine per strategy with N lanes; prints total and per-request tok/s, "
    "time to first token p50/p95 and acceptance per level, class and strategy, with llama-server -np N (plain, "
    "with the draft, and with its ngram-mod and ngram-cache drafting) as a peer when it is on PATH or built by "
    "`make llama-server`. E.g. --concurrency 1,2,4.",
)
@click.option(
    "--serve",
    is_flag=True,
    help="With --concurrency: also run `edgespec serve` as a peer over HTTP, in a process of its own on the same "
    "model files: --parallel N (auto), and at N > 1 --parallel 1 (one request at a time). It loads a second copy "
    "of the models.",
)
@click.option("--json", "as_json", is_flag=True, help="Print all measurements and summaries as JSON.")
def bench(
    tasks: str | None,
    max_tokens: int,
    prompts_per_task: int | None,
    strategies: str,
    peers: bool,
    lookup_len: int,
    temperature: float | None,
    seed: int,
    workloads: Path | None,
    costs: bool,
    loop_cost: bool,
    repeats: int | None,
    with_penalties_logprobs: bool,
    concurrency: str | None,
    serve: bool,
    as_json: bool,
    **opts: Any,
) -> None:
    """Measure decoding strategies side by side on a workload suite.

    Every prompt runs under each strategy back to back on the same loaded models, so speedups are ratios
    taken under the same conditions. --draft-len and --lookup are ignored here: --strategies picks.
    Greedy runs add each class's lookup ceiling: the speedup of the best possible prompt-lookup schedule on
    plain's output at this machine's decode costs, measured right before and after the class (~20 s each for a
    1.5B model on 2 cores). Tables go to stdout, the progress bar to stderr.
    """
    import json

    from tqdm import tqdm

    from edgespec.sampling import SamplingParams, readout_for

    with user_errors():
        suite = load_tasks(_split(tasks), prompts_per_task=prompts_per_task, source=workloads)
        if temperature is None:
            temperature = 0.8 if loop_cost else 0.0
        params = SamplingParams(temperature=temperature, seed=seed, max_tokens=max_tokens)
        names = _split(strategies) + (list(PEER_STRATEGIES) if peers else [])
        parse_strategies(names, has_draft=True)  # a typo fails before the models load
        levels = default_levels(concurrency) if concurrency else None
        if serve and levels is None:
            raise click.UsageError("--serve runs with --concurrency (edgespec serve as a peer under load)")
        with load_runtime(opts, quiet=as_json, parallel=max(levels) if levels else 1) as runtime:
            target, draft = runtime.engine.target, runtime.engine.draft_model
            if costs:
                readouts = {m: readout_for(params, m.n_vocab) for m in (target, draft) if m is not None}
                table = {m.name: decode_costs(m, readout=r) for m, r in readouts.items()}
                changes = {m.name: width_change_cost(m, readout=r) for m, r in readouts.items()}
                if as_json:
                    click.echo(json.dumps({"decode": table, "width_change": changes}, indent=1))
                else:
                    click.echo(render_costs(table, changes))
                return
            if loop_cost:
                _loop_cost(target, draft, suite, params, repeats or 3, as_json, with_penalties_logprobs)
                return
            if levels is not None:
                _concurrency(
                    target, draft, suite, _split(strategies), params, levels, lookup_len, peers, opts, as_json,
                    repeats or 1, serve,
                )  # fmt: skip
                return
            if draft is None and any(DRAFT_N.fullmatch(n) for n in names):
                click.echo("note: no draft model, so the draft-N strategies are skipped", err=True)
            runs = sum(len(t.prompts) for t in suite) * len(parse_strategies(names, has_draft=draft is not None))
            runs *= repeats or 1
            with tqdm(total=runs, desc="bench", unit="run", file=sys.stderr, disable=None, leave=False) as bar:

                def on_run(record: RunRecord, done: int, total: int) -> None:
                    bar.set_postfix_str(f"{record.task}/{record.prompt} {record.strategy}", refresh=False)
                    bar.update(1)

                result = run_bench(
                    target, draft, suite, names, params, lookup_len=lookup_len, p_min=opts["p_min"], on_run=on_run,
                    repeats=repeats or 1,
                )  # fmt: skip
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=1))
    else:
        click.echo(render_report(result))


def _concurrency(
    target: Any, draft: Any, suite: Any, strategies: list[str], params: Any, levels: list[int], lookup_len: int,
    peers: bool, opts: dict[str, Any], as_json: bool, repeats: int = 1, serve: bool = False,
) -> None:  # fmt: skip
    import json

    from tqdm import tqdm

    if target.n_seq < max(levels):
        click.echo(
            f"note: the KV cache of {max(levels)} sequences does not fit; levels above {target.n_seq} are skipped",
            err=True,
        )
        levels = [n for n in levels if n <= target.n_seq]
    n_strategies = len(parse_strategies(strategies, has_draft=draft is not None))  # every round
    # the first round only: llama-server plain, with the draft and with each n-gram drafter,
    once = ((len(LLAMA_PEERS) - (draft is None)) if peers else 0) * len(levels)
    once += sum(n > 1 for n in levels) if "auto" in strategies else 0  # auto-serial at levels above 1,
    if serve:  # edgespec serve --parallel N, and --parallel 1 at levels above 1
        once += len(levels) + sum(n > 1 for n in levels)
    runs = (len(levels) * n_strategies * repeats + once) * len(suite)
    with tqdm(total=runs, desc="bench", unit="run", file=sys.stderr, disable=None, leave=False) as bar:

        def on_run(record: Any) -> None:
            bar.set_postfix_str(f"N={record.level} {record.task} {record.strategy}", refresh=False)
            bar.update(1)

        records, notes = run_load_bench(
            target, draft, suite, strategies, params, levels, lookup_len=lookup_len, p_min=opts["p_min"],
            peers=peers, repeats=repeats, on_run=on_run, serve=serve,
        )  # fmt: skip
    if as_json:
        click.echo(json.dumps({"records": records_json(records), "notes": notes}, indent=1))
        return
    header = (
        f"concurrency: target {target.name}, draft {draft.name if draft is not None else 'none'}, "
        f"T={params.temperature:g}, up to {params.max_tokens} tokens a request, {target.n_threads} threads"
    )
    click.echo(render_load_report(records, notes, header))


PENALTIES_LOGPROBS = {
    "+penalties+logprobs": dict(repeat_penalty=1.1, frequency_penalty=0.5, presence_penalty=0.5, logprobs=5)
}


def _loop_cost(
    target: Any, draft: Any, suite: Any, params: Any, repeats: int, as_json: bool, with_extras: bool = False
) -> None:
    import json
    from dataclasses import asdict

    from tqdm import tqdm

    prompts = [render_prompt(target, task.prompts[0].messages) for task in suite]
    temperatures = [0.0] if params.temperature == 0 else [0.0, params.temperature]
    variants = PENALTIES_LOGPROBS if with_extras else {}
    # + the recorded runs
    runs = (repeats + 1) * len(temperatures) * (2 if draft is not None else 1) * (1 + len(variants))
    with tqdm(total=runs, desc="loop cost", unit="run", file=sys.stderr, disable=None, leave=False) as bar:
        rows = loop_costs(
            target,
            draft,
            prompts,
            temperatures,
            max_tokens=params.max_tokens,
            repeats=repeats,
            seed=params.seed or 0,
            on_run=lambda: bar.update(1),
            variants=variants,
        )
    if as_json:
        click.echo(json.dumps([asdict(r) for r in rows], indent=1))
        return
    header = (
        f"loop cost: target {target.name}, draft {draft.name if draft is not None else 'none'}, "
        f"{len(prompts)} prompts x up to {params.max_tokens} tokens, {repeats} alternating repetitions, "
        f"{target.n_threads} threads"
    )
    click.echo(render_loop_costs(rows, header))
