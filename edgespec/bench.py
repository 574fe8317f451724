"""`edgespec bench`: a workload suite run under several decoding strategies on the same loaded models.

Strategies (names as ``--strategies`` takes them):

* ``plain``: the target alone (γ = 0), the reference every speedup is a ratio to;
* ``draft-N``: the draft model at a fixed γ = N, no lookup;
* ``lookup``: prompt lookup at a fixed γ (``lookup_len``), plain rounds where it finds nothing;
* ``auto``: the cost-aware controller over the draft model, lookup and plain;
* ``llama-cpp`` / ``llama-cpp-lookup``: llama-cpp-python's own ``Llama`` on the target file, plain and with
  its ``LlamaPromptLookupDecoding`` (γ = ``lookup_len``), as peers.

Fairness: every strategy uses the same loaded models (the peers load their own copy of the target file, which
the OS shares through mmap), one warm-up generation precedes timing, and for each prompt all strategies run
back to back, starting at a rotating position, so load from other processes hits them alike. Only decoding is
timed: the prompt's prefill (cached across strategies for the engine, not for peers) is excluded. ``auto``
gets one fresh engine per task class, run over all of that class's prompts: its estimates carry over between
prompts of one kind of text, as they would in a session, but no class benefits from what another taught it.

One pass over a class is a few seconds of decoding per strategy, and on a shared 2-core VM the machine's speed moves
by a few per cent between two runs seconds apart: a class's ratio to plain moves with it, and a share of the lookup
ceiling's gain (below) several times as much (at a ceiling of 1.4x, 3 % of speed is 9 points of share; six runs
of the code edits ranged over 42-52 %). ``repeats`` runs each class that many times over, each repeat a replicate
of the whole class (``auto`` on a fresh engine calibrated anew, the ceiling priced around it); the report pools
the repeats and gives the range of their own ratios and shares beside the pooled ones.

Greedy runs also report each class's *lookup ceiling*: the speedup that the best possible lookup schedule would
reach on plain's output (drafting exactly as far as each proposal turns out right), priced with the mean of the
decode costs measured right before and right after that class (the curve drifts within minutes on a shared VM). No
controller of prompt lookup can beat it, so it says how much of what is there ``auto`` takes, and when a goal is out
of reach on this machine. Each strategy's share of it is taken against the ceiling
of its *own* outputs: a batched verify can flip a greedy near-tie, and the text after the flip may copy more or
less of the prompt than plain's (on the re-indent prompt, plain's answer kept the old indentation, a copy with a
ceiling of 2.3x, and auto's re-indented it, 1.2x).

Speedups are ratios of rates measured side by side in one run; nothing here asserts a time.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgespec.constraint import Grammar
from edgespec.errors import EdgespecError
from edgespec.sampling import ARGMAX, Readout

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

if TYPE_CHECKING:
    from edgespec.engine import Engine
    from edgespec.models.backend import Model
    from edgespec.sampling import SamplingParams

PLAIN = "plain"
ENGINE_STRATEGIES = ("plain", "draft-2", "draft-3", "draft-4", "lookup", "auto")
PEER_STRATEGIES = ("llama-cpp", "llama-cpp-lookup")
DEFAULT_LOOKUP_LEN = 4  # γ for fixed lookup; on a CPU a wider verify costs ~half a step per token
WARMUP_TOKENS = 8
_DRAFT_N = re.compile(r"draft-(\d+)")


# ----- the workload suite -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prompt:
    id: str
    messages: tuple[dict, ...]  # chat messages (role, content), rendered with the target's own template
    json_schema: str | None = None  # the reply must be a JSON document valid under this schema (JSON text)
    tools: str | None = None  # the reply must call one of these tools (OpenAI's tools list, JSON text)

    @property
    def constrained(self) -> bool:
        return self.json_schema is not None or self.tools is not None


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    prompts: tuple[Prompt, ...]


def _parse_task(text: str, source: str) -> Task:
    try:
        raw = tomllib.loads(text)
        prompts = tuple(
            Prompt(
                str(p["id"]),
                tuple({"role": m["role"], "content": m["content"]} for m in p["messages"]),
                _json_text(p.get("json_schema")),
                _json_text(p.get("tools")),
            )
            for p in raw["prompts"]
        )
        task = Task(str(raw["name"]), str(raw.get("description", "")), prompts)
    except (tomllib.TOMLDecodeError, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise EdgespecError(f"{source}: not a workload file ({exc})") from exc
    if not task.prompts:
        raise EdgespecError(f"{source}: the task {task.name!r} has no prompts")
    return task


def load_tasks(
    names: Sequence[str] | None = None, *, prompts_per_task: int | None = None, source: Path | None = None
) -> list[Task]:
    """The task classes to run, in the suite's order (``names`` picks and orders a subset).

    ``source``: a workload ``.toml`` or a folder of them instead of the suite shipped in edgespec/workloads.
    """
    if source is None:
        shipped = resources.files("edgespec").joinpath("workloads")
        files = [(f.name, f.read_text("utf-8")) for f in shipped.iterdir() if f.name.endswith(".toml")]
    elif source.is_dir():
        files = [(str(f), f.read_text("utf-8")) for f in source.glob("*.toml")]
    else:
        files = [(str(source), source.read_text("utf-8"))]
    parsed = sorted((_parse_task(text, name) for name, text in files), key=lambda t: t.name)
    suite = {t.name: t for t in parsed}
    if names:
        unknown = [n for n in names if n not in suite]
        if unknown:
            raise EdgespecError(f"unknown task {', '.join(unknown)}; the suite has: {', '.join(suite)}")
        tasks = [suite[n] for n in names]
    else:
        tasks = list(suite.values())
    if prompts_per_task is not None:
        tasks = [Task(t.name, t.description, t.prompts[:prompts_per_task]) for t in tasks]
    return tasks


def _json_text(value: Any) -> str | None:
    """A workload's JSON field (a TOML string of JSON), checked."""
    if value is None:
        return None
    json.loads(value)
    return str(value)


def render_prompt(model: Model, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> list[int]:
    """Tokens of ``messages`` in the model's chat format, as ``Runtime.chat`` would send them."""
    from edgespec.api import Runtime
    from edgespec.engine import Engine

    return Runtime(Engine(model, None, draft_len=0, lookup=False)).render_chat(messages, tools)


def prompt_job(model: Model, prompt: Prompt) -> tuple[list[int], Grammar | None]:
    """A workload prompt's tokens (its tools in the chat template), and the constraint its reply is held to: its JSON
    schema, or a call of one of its tools (as a server's ``tool_choice: required`` makes it)."""
    from edgespec.tools import call_grammar, markers_are_tokens, parse_tools, template_format

    if prompt.tools is None:
        grammar = Grammar.json_schema(prompt.json_schema) if prompt.json_schema is not None else None
        return render_prompt(model, prompt.messages), grammar
    tools = parse_tools(json.loads(prompt.tools))
    listed = [t.as_template_dict() for t in tools]
    fmt = template_format(model.chat_template)
    if fmt is None:
        # A template that takes no tools (a server refuses them there): the bench lists them in a system message
        # and holds the reply to the Hermes call format, so every model runs the class.
        fmt = "hermes"
        system = (
            "You may call these functions:\n<tools>\n" + "\n".join(json.dumps(t) for t in listed) + "\n</tools>\n"
            'Reply with one call: <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
            "</tool_call>"
        )
        tokens = render_prompt(model, ({"role": "system", "content": system}, *prompt.messages))
    else:
        tokens = render_prompt(model, prompt.messages, listed)
    return tokens, call_grammar(fmt, tools, special_markers=markers_are_tokens(model), several=False)


# ----- one measured generation ------------------------------------------------------------------------------
@dataclass
class RunRecord:
    """One prompt under one strategy. ``token_times`` spreads each round's time over the tokens it made."""

    task: str
    prompt: str
    strategy: str
    generated: int  # tokens committed (an end-of-generation token included)
    decode_tokens: int  # tokens the decode time covers (peers: the first token comes with their prefill)
    t_prefill: float
    t_decode: float
    t_outside: float | None  # decode time spent outside llama.cpp (the Python loop); unknown for peers
    rounds: int  # target decodes after the prompt
    drafted: int
    accepted: int
    finish_reason: str
    text: str
    token_times: list[float] = field(default_factory=list)  # seconds per token, one entry per decode token
    ceiling: float | None = None  # greedy only: the lookup ceiling's speedup on this output (see lookup_ceiling)
    sampling_path: str | None = None  # where the target's rows were sampled (engine runs)
    forced: int = 0  # committed tokens a constraint forced (free drafts)
    t_constraint: float = 0.0  # seconds in the constraint engine (masks, its state): part of t_outside
    repeat: int = 0  # which of the class's repeats (see run_bench's ``repeats``)


def _spread(times: list[float], dt: float, n: int) -> None:
    times.extend([dt / n] * n)


def measure_engine(engine: Engine, prompt: Sequence[int], params: SamplingParams) -> dict[str, Any]:
    """Generate once; times come from the engine's own clock in each event's stats, not the consumer's."""
    from edgespec.events import Finished

    times: list[float] = []
    t_mark: float | None = None
    n_mark = 0
    for event in engine.stream(prompt, params):
        s = event.stats
        if t_mark is None:
            t_mark = s.t_prefill
        if s.generated > n_mark:  # a round committed tokens (a tail-only chunk repeats the last stats)
            _spread(times, s.t_total - t_mark, s.generated - n_mark)
            t_mark, n_mark = s.t_total, s.generated
        if isinstance(event, Finished):
            done = event
    s = done.stats
    return dict(
        generated=s.generated,
        decode_tokens=s.generated,
        t_prefill=s.t_prefill,
        t_decode=s.t_decode,
        t_outside=s.t_outside,
        rounds=s.rounds,
        drafted=s.drafted,
        accepted=s.accepted,
        finish_reason=done.finish_reason,
        text=done.text,
        token_times=times,
        tokens=list(done.tokens),
        sampling_path=s.sampling_path,
        forced=s.forced,
        t_constraint=s.t_constraint,
    )


class Peer:
    """llama-cpp-python's high-level ``Llama`` on the target file, with or without its prompt-lookup drafting.

    Its loop is observed from outside: ``eval`` is wrapped to count target decodes and ``generate`` to stamp each
    token as it comes out, so the tokens sampled after the same eval form one round.
    """

    def __init__(self, path: Path, *, n_ctx: int, n_threads: int, n_gpu_layers: int, lookup_len: int = 0) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        class CountingLookup(LlamaPromptLookupDecoding):
            drafted = 0

            def __call__(self, input_ids, /, **kwargs):
                out = super().__call__(input_ids, **kwargs)
                self.drafted += len(out)
                return out

        self.drafter = CountingLookup(num_pred_tokens=lookup_len) if lookup_len else None
        # logits_all must be explicit with a draft model: 0.3.36 turns it on internally but sizes the logits
        # buffer by the argument, n_batch rows, and fails once a context outgrows n_batch.
        self.llm = Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_threads=n_threads,
            n_threads_batch=n_threads,
            n_gpu_layers=n_gpu_layers,
            draft_model=self.drafter,
            logits_all=self.drafter is not None,
            verbose=False,
        )
        self.evals = 0
        self.stamps: list[tuple[float, int]] = []  # (time, evals so far) per generated token
        eval_, generate = self.llm.eval, self.llm.generate

        def counted_eval(tokens):
            self.evals += 1
            return eval_(tokens)

        def stamped_generate(*args, **kwargs):
            for token in generate(*args, **kwargs):
                self.stamps.append((time.perf_counter(), self.evals))
                yield token

        # Instance attributes shadow the methods that create_completion and generate call.
        self.llm.eval = counted_eval
        self.llm.generate = stamped_generate

    def measure(self, prompt: Sequence[int], params: SamplingParams) -> dict[str, Any]:
        self.evals = 0
        self.stamps = stamps = []
        drafted0 = self.drafter.drafted if self.drafter else 0
        t0 = time.perf_counter()
        pieces, finish = [], "length"
        for chunk in self.llm.create_completion(
            prompt=list(prompt),
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            min_p=params.min_p,
            repeat_penalty=1.0,
            seed=params.seed,
            stream=True,
        ):
            choice = chunk["choices"][0]
            pieces.append(choice["text"])
            finish = choice["finish_reason"] or finish
        if not stamps:
            raise EdgespecError("llama-cpp-python generated nothing")
        # The first token is sampled from the prompt's own eval, so it belongs to the prefill.
        times: list[float] = []
        rounds = accepted = 0
        t_mark, i = stamps[0][0], 1
        while i < len(stamps):
            j = i
            while j < len(stamps) and stamps[j][1] == stamps[i][1]:
                j += 1
            _spread(times, stamps[j - 1][0] - t_mark, j - i)
            rounds, accepted, t_mark, i = rounds + 1, accepted + (j - i - 1), stamps[j - 1][0], j
        return dict(
            generated=len(stamps),
            decode_tokens=len(stamps) - 1,
            t_prefill=stamps[0][0] - t0,
            t_decode=stamps[-1][0] - stamps[0][0],
            t_outside=None,
            rounds=rounds,
            drafted=(self.drafter.drafted - drafted0) if self.drafter else 0,
            accepted=accepted,
            finish_reason="eos" if finish == "stop" else finish,
            text="".join(pieces),
            token_times=times,
        )

    def close(self) -> None:
        self.llm.close()


# ----- the run ----------------------------------------------------------------------------------------------
def parse_strategies(names: Iterable[str], *, has_draft: bool) -> list[str]:
    """Validate strategy names; ``plain`` is always run (first) because every speedup is relative to it."""
    out = [PLAIN]
    for name in names:
        name = name.strip()
        if not name or name in out:
            continue
        m = _DRAFT_N.fullmatch(name)
        if m and not 1 <= int(m.group(1)) <= 64:
            raise EdgespecError(f"{name}: γ must be 1..64")
        if not (m or name in ENGINE_STRATEGIES or name in PEER_STRATEGIES):
            known = ", ".join((*ENGINE_STRATEGIES, *PEER_STRATEGIES))
            raise EdgespecError(f"unknown strategy {name!r}; known: {known} (draft-N for any γ = N)")
        if m and not has_draft:
            continue  # no draft model loaded: the caller says so
        out.append(name)
    return out


def _engine_for(
    name: str, target: Model, draft: Model | None, lookup_len: int, p_min: float, parallel: int = 1
) -> Engine:
    from edgespec.engine import Engine

    if name == PLAIN:
        return Engine(target, None, draft_len=0, lookup=False, parallel=parallel)
    if name == "lookup":
        return Engine(target, None, draft_len=lookup_len, lookup=True, parallel=parallel)
    if name == "auto":
        return Engine(target, draft, draft_len="auto", lookup=True, p_min=p_min, parallel=parallel)
    gamma = int(_DRAFT_N.fullmatch(name).group(1))  # type: ignore[union-attr]
    return Engine(target, draft, draft_len=gamma, lookup=False, p_min=p_min, parallel=parallel)


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


OnRun = Callable[[RunRecord, int, int], None]  # (record, runs done, runs in all)


def run_bench(
    target: Model,
    draft: Model | None,
    tasks: Sequence[Task],
    strategies: Sequence[str],
    params: SamplingParams,
    *,
    lookup_len: int = DEFAULT_LOOKUP_LEN,
    p_min: float = 0.0,
    warmup: bool = True,
    ceiling: bool = True,
    on_run: OnRun | None = None,
    repeats: int = 1,
) -> BenchResult:
    """Run every prompt of ``tasks`` under every strategy (see the module docstring); collect the records.

    ``ceiling`` (greedy only): also compute, on each output, the speedup of the best possible lookup schedule
    under this machine's decode costs (measured once here): what no lookup controller can beat. ``repeats``: run
    each class that many times over, each a replicate of the whole class (``auto`` on a fresh engine that calibrates
    anew, the strategies' order rotating on, the ceiling priced around that repeat); the report pools them."""
    from edgespec.drafters.controller_sim import lookup_ceiling
    from edgespec.engine import DEFAULT_MAX_GAMMA

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    strategies = parse_strategies(strategies, has_draft=draft is not None)
    jobs = {(t.name, p.id): prompt_job(target, p) for t in tasks for p in t.prompts}
    prompts = {key: tokens for key, (tokens, _) in jobs.items()}
    longest = max((len(p) for p in prompts.values()), default=0)
    engines = {s: _engine_for(s, target, draft, lookup_len, p_min) for s in strategies if s not in PEER_STRATEGIES}
    peers: dict[str, Peer] = {}
    total, done = len(prompts) * len(strategies) * repeats, 0
    records: list[RunRecord] = []
    try:
        # The peers keep an n_ctx × n_vocab logits buffer when drafting: size their context to the need.
        peer_ctx = min(target.n_ctx, -(-(longest + params.max_tokens + lookup_len + 16) // 256) * 256)
        for name in strategies:
            if name in PEER_STRATEGIES:
                peers[name] = Peer(
                    target.path,
                    n_ctx=peer_ctx,
                    n_threads=target.n_threads,
                    n_gpu_layers=target.n_gpu_layers,
                    lookup_len=lookup_len if name == "llama-cpp-lookup" else 0,
                )
        if warmup and prompts:
            # First calls pay one-off costs (page faults on mmapped weights, allocations, caches): not timed.
            first = next(iter(prompts.values()))
            short = replace(params, max_tokens=min(WARMUP_TOKENS, params.max_tokens))
            for runner in (*engines.values(), *peers.values()):
                _measure(runner, first, short)

        widths = range(1, DEFAULT_MAX_GAMMA + 2)

        # Priced where the verifies run: after a prompt of the run's median length and half the tokens asked for. A
        # wide decode's attention grows with the context (a 16-token decode measured 7.2 single steps after 64
        # tokens, 7.5 after 400 and 8.0 after 700 on the dev CPU), so costs read after a short context promise a
        # ceiling that the runs' longer contexts cannot reach.
        lengths = sorted(len(p) for p in prompts.values())
        context = lengths[len(lengths) // 2] + params.max_tokens // 2 if lengths else 64

        def price() -> dict[int, float]:
            # A median of 4 per width: of 2 it is their mean, which one slow decode moves, and the ceiling with it.
            return decode_costs(target, widths, reps=4, context=context)

        # The ceiling of a class is priced at the mean of the costs measured right before and right after it: on a
        # 2-core VM the curve drifts within minutes (a 16-token decode at 7.0, 9.3 and 6.8 single steps within one
        # hour), and a ceiling priced at costs from another part of the run says what was possible then, not while
        # the strategies ran.
        priced = ceiling and params.greedy
        curves = [price()] if priced else []  # before the first class, then after each (each of its repeats)
        i = 0
        for task in tasks:
            for repeat in range(repeats):
                if "auto" in engines:  # fresh per task class and repeat: see the module docstring
                    engines["auto"] = _engine_for("auto", target, draft, lookup_len, p_min)
                outputs: list[tuple[int, list[int], list[int]]] = []  # (record index, prompt, output) to price
                for prompt in task.prompts:
                    order = strategies[i % len(strategies) :] + strategies[: i % len(strategies)]
                    i += 1
                    for name in order:
                        runner = engines[name] if name in engines else peers[name]
                        tokens, grammar = jobs[(task.name, prompt.id)]
                        if grammar is not None and name in peers:  # llama-cpp-python's loop takes no llguidance grammar
                            total -= 1
                            continue
                        result = _measure(runner, tokens, replace(params, constraint=grammar))
                        output = result.pop("tokens", None)
                        if priced and output:
                            outputs.append((len(records), tokens, output))
                        records.append(RunRecord(task.name, prompt.id, name, **result, repeat=repeat))
                        done += 1
                        if on_run is not None:
                            on_run(records[-1], done, total)
                if outputs:
                    curves.append(price())
                    cost = {b: (curves[-2][b] + curves[-1][b]) / 2 for b in widths}
                    for at, tokens, output in outputs:
                        seconds = lookup_ceiling(tokens, output, cost.__getitem__, DEFAULT_MAX_GAMMA)
                        records[at] = replace(records[at], ceiling=len(output) * cost[1] / seconds)
    finally:
        for peer in peers.values():
            peer.close()
    config = _config(target, draft, tasks, strategies, params, lookup_len, DEFAULT_MAX_GAMMA)
    config["repeats"] = repeats
    if curves:
        # Seconds per decode by width, as measured before the first class and after each (each of its repeats): how
        # the machine drifted.
        config["ceiling_costs"] = [{str(b): c[b] for b in widths} for c in curves]
        config["ceiling_context"] = context
    return BenchResult(config, records)


def _measure(runner: Engine | Peer, prompt: list[int], params: SamplingParams) -> dict[str, Any]:
    if isinstance(runner, Peer):
        return runner.measure(prompt, params)
    return measure_engine(runner, prompt, params)


def _config(
    target: Model,
    draft: Model | None,
    tasks: Sequence[Task],
    strategies: Sequence[str],
    params: SamplingParams,
    lookup_len: int,
    max_gamma: int,
) -> dict[str, Any]:
    import os
    import platform

    import llama_cpp

    return {
        "target": str(target.path),
        "target_description": target.description,
        "draft": str(draft.path) if draft is not None else None,
        "draft_description": draft.description if draft is not None else None,
        "tasks": [t.name for t in tasks],
        "strategies": list(strategies),
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "seed": params.seed,
        "lookup_len": lookup_len,
        "ceiling_max_gamma": max_gamma,
        "n_threads": target.n_threads,
        "n_gpu_layers": target.n_gpu_layers,
        "bit_exact": getattr(target, "bit_exact", False),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "llama_cpp_python": llama_cpp.__version__,
    }


# ----- summaries --------------------------------------------------------------------------------------------
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


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), interpolating linearly between closest ranks; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


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
def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell; the first column left-aligned, the rest right-aligned."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(str(c).ljust(w) if j == 0 else str(c).rjust(w) for j, (c, w) in pairs)

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]).rstrip()


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


def value_range(values: Sequence[float | None], spec: str, suffix: str = "") -> str:
    """``low-high`` of the values given; "-" for none, or where any is missing."""
    known = [v for v in values if v is not None]
    if not known or len(known) < len(values):
        return "-"
    return f"{format(min(known), spec)}-{format(max(known), spec)}{suffix}"


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


# ----- decode costs -----------------------------------------------------------------------------------------
COST_WIDTHS = (1, 2, 3, 4, 5, 6, 8, 16)


def decode_costs(
    model: Model,
    widths: Sequence[int] = COST_WIDTHS,
    reps: int = 8,
    readout: Readout = ARGMAX,
    context: int = 64,
) -> dict[int, float]:
    """Median seconds of one decode of k tokens after a ``context``-token context (less if the widest decode would
    not fit after it), every row read back as ``readout`` (as a verify asks; greedy's argmax by default)."""
    import statistics

    from edgespec.drafters.costs import time_decodes

    context = max(min(context, model.n_ctx - max(widths, default=1) - 1), 1)
    with _after_a_context(model, context) as token:
        # The first use of a batch shape builds a graph: not counted.
        return {k: statistics.median(time_decodes(model, token, k, reps + 1, readout)[1:]) for k in widths}


def width_change_cost(model: Model, reps: int = 8, readout: Readout = ARGMAX) -> float:
    """What a one-token decode costs more right after a 2-token one than after another one-token decode (llama.cpp
    builds a new graph for a batch of another shape), after a 64-token context: see
    :func:`edgespec.drafters.costs.time_switch`."""
    from edgespec.drafters.costs import time_switch

    with _after_a_context(model) as token:
        return time_switch(model, token, 2, reps, readout)


@contextmanager
def _after_a_context(model: Model, length: int = 64) -> Iterator[int]:
    """The model's KV holding a context of ``length`` tokens (the token given) while timings are taken, empty after."""
    token = model.vocab.bos if model.vocab.bos >= 0 else 0
    model.truncate(0)
    model.decode([token] * length)
    try:
        yield token
    finally:
        model.truncate(0)


def render_costs(table: dict[str, dict[int, float]], changes: dict[str, float] | None = None) -> str:
    """The decode costs by width, and (``changes``) what a change of width adds, per model."""
    headers = ["model", *(f"k={k}" for k in COST_WIDTHS)]
    rows = [
        [name, *(f"{1e3 * costs[k]:.1f} ms ({costs[k] / costs[1]:.2f}x)" for k in COST_WIDTHS)]
        for name, costs in table.items()
    ]
    notes = "one decode of k tokens: milliseconds (and multiple of a single token), each width decoded again and again"
    if changes:
        headers.append("width change")
        for row, (name, costs) in zip(rows, table.items(), strict=True):
            row.append(f"+{1e3 * changes[name]:.2f} ms ({changes[name] / costs[1]:.0%})")
        notes += (
            "\nwidth change: what a decode adds when its width differs from the last decode's (llama.cpp builds a new "
            "graph; a round that drafts between plain ones pays it twice, and auto prices that)"
        )
    return format_table(headers, rows) + "\n" + notes


# ----- the loop's own cost ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoopCost:
    """One strategy at one temperature over the prompts, repeated: what the Python loop costs beside llama.cpp."""

    run: str  # e.g. "plain T=0.8"
    sampling_path: str
    tokens_per_second: float  # pooled over every repetition
    ms_per_token: float  # pooled
    best_ms_per_token: float  # the fastest repetition's
    outside_ms_per_token: float  # pooled: decode time outside llama.cpp's forward passes, per committed token
    outside_ms_per_round: float  # the same per verify round
    replayed_ms_per_token: float = 0.0  # the same runs with each decode's output played back: the loop, caches warm
    replayed_ms_per_round: float = 0.0


def loop_costs(
    target: Model,
    draft: Model | None,
    prompts: Sequence[list[int]],
    temperatures: Sequence[float],
    *,
    max_tokens: int,
    repeats: int = 3,
    draft_gamma: int = 4,
    seed: int = 0,
    on_run: Callable[[], None] | None = None,
    variants: dict[str, dict[str, Any]] | None = None,
) -> list[LoopCost]:
    """Plain decoding (and the draft model at a fixed γ, lookup off) at each temperature, the runs alternating
    within each repetition so that a slower spell of the machine hits all of them alike.

    Then each run once more, recorded, and replayed ``repeats`` times with every decode's output played back at once
    (:mod:`edgespec.replay`): the same tokens with no forward pass between the rounds, so what is left outside is
    the loop with warm caches. Sampling uses the CLI's defaults (top-k 40, top-p 0.95, min-p 0.05) at temperatures
    above 0. ``variants``: more sampling settings (a name and SamplingParams fields, e.g. penalties and logprobs),
    each run beside the plain settings at every temperature."""
    from edgespec.engine import Engine
    from edgespec.replay import Recorder, Replay, ReplayDiverged
    from edgespec.sampling import SamplingParams

    gammas = {"plain": 0}
    if draft is not None:
        gammas[f"draft-{draft_gamma}"] = draft_gamma

    def engine(name: str, t: Any, d: Any) -> Engine:
        return Engine(t, d if gammas[name] else None, draft_len=gammas[name], lookup=False)

    engines = {name: engine(name, target, draft) for name in gammas}
    extra = {"": {}, **(variants or {})}
    runs = [(name, t, v) for name in engines for t in temperatures for v in extra]
    totals: dict[tuple[str, float, str], list[dict[str, Any]]] = {run: [] for run in runs}
    for rep in range(repeats):
        for name, t, v in runs:
            params = SamplingParams(temperature=t, max_tokens=max_tokens, seed=seed + rep, **extra[v])
            results = [measure_engine(engines[name], prompt, params) for prompt in prompts]
            totals[(name, t, v)].append(
                dict(
                    tokens=sum(r["generated"] for r in results),
                    rounds=sum(r["rounds"] for r in results),
                    seconds=sum(r["t_decode"] for r in results),
                    outside=sum(r["t_outside"] for r in results),
                    path=results[0]["sampling_path"],
                )
            )
            if on_run is not None:
                on_run()
    replayed: dict[tuple[str, float, str], list[float]] = {}  # outside seconds, tokens, rounds
    for name, t, v in runs:
        params = SamplingParams(temperature=t, max_tokens=max_tokens, seed=seed, **extra[v])
        recorded = []
        for prompt in prompts:
            rec_t, rec_d = Recorder(target), Recorder(draft) if draft is not None else None
            tokens = measure_engine(engine(name, rec_t, rec_d), prompt, params)["tokens"]
            recorded.append((prompt, rec_t, rec_d, tokens))
        sums = [0.0, 0.0, 0.0]
        for _ in range(repeats):
            for prompt, rec_t, rec_d, tokens in recorded:
                r = measure_engine(engine(name, Replay(rec_t), Replay(rec_d) if rec_d else None), prompt, params)
                if r["tokens"] != tokens:
                    raise ReplayDiverged(f"{name} T={t:g} {v}: the replay generated other tokens than the recorded run")
                sums[0] += r["t_outside"]
                sums[1] += r["generated"]
                sums[2] += r["rounds"]
        replayed[(name, t, v)] = sums
        if on_run is not None:
            on_run()
    out = []
    for (name, t, v), reps in totals.items():
        tokens, rounds = sum(r["tokens"] for r in reps), sum(r["rounds"] for r in reps)
        seconds, outside = sum(r["seconds"] for r in reps), sum(r["outside"] for r in reps)
        r_outside, r_tokens, r_rounds = replayed[(name, t, v)]
        out.append(
            LoopCost(
                run=f"{name} T={t:g}" + (f" {v}" if v else ""),
                sampling_path=reps[0]["path"],
                tokens_per_second=tokens / seconds if seconds else 0.0,
                ms_per_token=1e3 * seconds / tokens if tokens else 0.0,
                best_ms_per_token=min(1e3 * r["seconds"] / r["tokens"] for r in reps if r["tokens"]),
                outside_ms_per_token=1e3 * outside / tokens if tokens else 0.0,
                outside_ms_per_round=1e3 * outside / rounds if rounds else 0.0,
                replayed_ms_per_token=1e3 * r_outside / r_tokens if r_tokens else 0.0,
                replayed_ms_per_round=1e3 * r_outside / r_rounds if r_rounds else 0.0,
            )
        )
    return out


def render_loop_costs(rows: Sequence[LoopCost], header: str) -> str:
    table = format_table(
        [
            "run",
            "sampling",
            "tok/s",
            "ms/tok",
            "best ms/tok",
            "outside ms/tok",
            "outside ms/round",
            "replayed ms/tok",
            "replayed ms/round",
        ],
        [
            [
                r.run,
                r.sampling_path,
                f"{r.tokens_per_second:.1f}",
                f"{r.ms_per_token:.2f}",
                f"{r.best_ms_per_token:.2f}",
                f"{r.outside_ms_per_token:.3f}",
                f"{r.outside_ms_per_round:.3f}",
                f"{r.replayed_ms_per_token:.3f}",
                f"{r.replayed_ms_per_round:.3f}",
            ]
            for r in rows
        ],
    )
    return (
        f"{header}\n{table}\n"
        "outside: decode time spent outside llama.cpp's forward passes (the Python loop: drafting logic, warps, "
        "acceptance, bookkeeping); best: the fastest repetition\n"
        "replayed: each run recorded once (the first seed) and played back --repeats times from its decode outputs: "
        "the same tokens and all of edgespec's Python (the batch filled, the rows copied out) with no forward pass "
        "between rounds, so the CPU's caches stay warm; on a CPU most of the gap to 'outside' is refilling the "
        "caches each decode evicts"
    )
