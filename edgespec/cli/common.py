"""What every command that loads models shares: options, error handling, loading with progress bars.

Kept apart from :mod:`edgespec.cli` so that subcommand modules (chat, bench, models) can use it without importing
the group that registers them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from edgespec.errors import EdgespecError
from edgespec.events import Stats

DRAFT_LEN_HELP = (
    "Draft length γ: 'auto' (the controller picks the drafter and γ each round, 0 included), a fixed integer, "
    "or 'off' (= 0, plain decoding). Default: the pair's recommendation, else auto."
)


def fail(message: str) -> None:
    """Print a one-line error and exit 1 (no traceback: the message says what to do)."""
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


@contextmanager
def user_errors():
    try:
        yield
    except EdgespecError as exc:
        fail(str(exc))


def parse_draft_len(_ctx: click.Context | None, _param: click.Parameter | None, value: str | None) -> int | str | None:
    """Click callback for --draft-len (None: the pair's recommendation, else 'auto')."""
    if value is None:
        return None
    # Imported here: the engine imports llama.cpp, and the command line must start without it (`edgespec doctor`
    # says what is wrong with an install whose llama.cpp does not load).
    from edgespec.engine import parse_draft_len as _parse_draft_len

    try:
        return _parse_draft_len(value)
    except EdgespecError as exc:
        raise click.BadParameter(str(exc)) from None


def parse_gpu_layers(_ctx: click.Context | None, _param: click.Parameter | None, value: str | None) -> int | None:
    """Click callback for -ngl/-ngld: 'auto' (None: offload what fits), 'all' (-1) or a number of layers."""
    if value is None:
        return None
    text = str(value).strip().lower()
    if text == "auto":
        return None
    if text == "all":
        return -1
    try:
        layers = int(text)
    except ValueError:
        raise click.BadParameter(f"expected 'auto', 'all' or a number of layers, got {value!r}") from None
    if layers < -1:
        raise click.BadParameter(f"expected 'auto', 'all', -1 or a number of layers >= 0, got {value!r}")
    return layers


BIT_EXACT_HELP = (
    "Greedy output token-identical to plain decoding whatever the drafter and γ (≤ 6): the target runs llama.cpp's "
    "CPU kernels that round a verify batch exactly as single-token decodes (no weight repacking, a BF16 KV cache). "
    "Costs decode speed: plain decoding of the Qwen2.5-Coder 1.5B on 2-core CPUs ran 3-5% slower on one machine, "
    "14% on another. Off by default: sampling is exact either way; this only settles near-ties that kernels round "
    "differently. GPU kernels are not covered."
)


def model_options(f: Callable) -> Callable:
    """Options shared by every command that loads models (generate, chat, bench, serve)."""
    for decorator in reversed(
        [
            click.option("--pair", help="A target/draft pair from models.toml (default: the registry's default)."),
            click.option(
                "--target",
                "-m",
                help="Target model: a GGUF path, a models.toml name, hf:ORG/REPO[:QUANT] or an id from "
                "`edgespec models scan`.",
            ),
            click.option(
                "--draft",
                "-d",
                help="Draft model: a GGUF path, a models.toml name, hf:ORG/REPO[:QUANT], an id from `edgespec "
                "models scan`, 'auto' (the best compatible one here) or 'none'. Default: the pair's draft, else auto.",
            ),
            click.option(
                "--n-ctx",
                default=4096,
                show_default=True,
                type=click.IntRange(min=16),
                help="Context window in tokens.",
            ),
            click.option(
                "--n-gpu-layers",
                "-ngl",
                default="auto",
                show_default=True,
                callback=parse_gpu_layers,
                help="Target layers on the GPU: 'auto' (as many as fit its free memory; none without a GPU build), "
                "'all' (= -1), or a number; 0 = CPU only. Offload needs a CUDA/Metal/Vulkan build.",
            ),
            click.option(
                "--n-gpu-layers-draft",
                "-ngld",
                default=None,
                callback=parse_gpu_layers,
                help="Draft layers on the GPU, as for -ngl (default: what fits after the target with -ngl auto, "
                "else the same as -ngl).",
            ),
            click.option(
                "--threads",
                "-t",
                type=click.IntRange(min=1),
                default=None,
                help="CPU threads (default: physical cores).",
            ),
            click.option("--draft-len", default=None, callback=parse_draft_len, help=DRAFT_LEN_HELP),
            click.option(
                "--lookup/--no-lookup",
                default=True,
                show_default=True,
                help="Also draft by prompt lookup (n-gram matches in the prompt and output: free).",
            ),
            click.option(
                "--p-min",
                default=0.0,
                show_default=True,
                help="Stop a model draft when its top probability falls below this.",
            ),
            click.option("--bit-exact", is_flag=True, help=BIT_EXACT_HELP),
            click.option(
                "--rpc",
                metavar="HOST:PORT[,...]",
                default=None,
                help="Put the target's offloaded layers on these RPC servers (`edgespec rpc-server` on each) before "
                "this machine's GPUs: a model bigger than one machine. With -ngl auto, as many layers as fit their "
                "memory. The draft stays here unless --rpc-draft.",
            ),
            click.option("--rpc-draft", is_flag=True, help="Place the draft model on the --rpc servers too."),
        ]
    ):
        f = decorator(f)
    return f


def sampling_options(*, max_tokens: int = 256) -> Callable[[Callable], Callable]:
    """Sampling options (llama.cpp's defaults); ``max_tokens`` is the command's default length cap."""
    return lambda f: _add_sampling_options(f, max_tokens)


def _add_sampling_options(f: Callable, max_tokens: int) -> Callable:
    for decorator in reversed(
        [
            click.option(
                "--max-tokens", "-n", default=max_tokens, show_default=True, help="Tokens to generate at most."
            ),
            click.option("--temperature", "--temp", default=0.8, show_default=True, help="0 = greedy."),
            click.option("--top-k", default=40, show_default=True, help="0 = off."),
            click.option("--top-p", default=0.95, show_default=True, help="1 = off."),
            click.option("--min-p", default=0.05, show_default=True, help="0 = off."),
            click.option("--seed", type=int, default=None, help="Seed for a reproducible run."),
            click.option("--stop", multiple=True, help="Stop string (repeatable)."),
            click.option(
                "--repeat-penalty",
                default=1.0,
                show_default=True,
                help="Divide a seen token's positive logit by this (multiply a negative one); 1 = off. Exact under "
                "speculation: each drafted position is penalised with the drafts before it.",
            ),
            click.option(
                "--repeat-last-n", default=64, show_default=True, help="Tokens the penalties look back over."
            ),
            click.option(
                "--presence-penalty", default=0.0, show_default=True, help="Subtract from seen tokens' logits; 0 = off."
            ),
            click.option(
                "--frequency-penalty",
                default=0.0,
                show_default=True,
                help="Subtract this times a token's count from its logit; 0 = off.",
            ),
        ]
    ):
        f = decorator(f)
    return f


def constraint_options(f: Callable) -> Callable:
    """What the output must match: at most one of a JSON schema, any JSON object, a regex, a grammar."""
    for decorator in reversed(
        [
            click.option(
                "--json-schema",
                metavar="FILE|JSON",
                help="Output a JSON document valid under this schema (a file, or the schema itself).",
            ),
            click.option("--json-object", is_flag=True, help="Output any JSON object."),
            click.option("--regex", metavar="PATTERN", help="Output a string matching PATTERN in full (Rust regex)."),
            click.option(
                "--grammar",
                metavar="FILE",
                type=click.Path(dir_okay=False),
                help="Output a sentence of this grammar: GBNF as llama.cpp writes it (root ::= ...; a .gbnf file) "
                "or llguidance's Lark syntax.",
            ),
        ]
    ):
        f = decorator(f)
    return f


def constraint_from(opts: dict[str, Any]):
    """The :class:`~edgespec.constraint.Grammar` the constraint options ask for, or None."""
    from edgespec.constraint import Grammar

    given = [name for name in ("json_schema", "json_object", "regex", "grammar") if opts.get(name)]
    if len(given) > 1:
        raise click.UsageError("give one of --json-schema, --json-object, --regex, --grammar")
    if not given:
        return None
    if opts.get("json_object"):
        return Grammar.json_object()
    if opts.get("regex"):
        return Grammar.regex(opts["regex"])
    if opts.get("json_schema"):
        value = opts["json_schema"]
        path = Path(value)
        if not value.lstrip().startswith("{") and not path.is_file():
            raise click.BadParameter(f"{value} is neither a file nor a JSON schema", param_hint="--json-schema")
        return Grammar.json_schema(path.read_text() if not value.lstrip().startswith("{") else value)
    path = Path(opts["grammar"])
    try:
        text = path.read_text()
    except OSError as e:
        raise click.BadParameter(f"cannot read {path}: {e.strerror}", param_hint="--grammar") from None
    if path.suffix in (".gbnf", ".lark"):
        return Grammar.gbnf(text) if path.suffix == ".gbnf" else Grammar.lark(text)
    return Grammar.gbnf(text) if "::=" in text else Grammar.lark(text)  # GBNF's rules read "name ::= ..."


def sampling_params(opts: dict[str, Any]):
    from edgespec.sampling import SamplingParams

    return SamplingParams(
        constraint=constraint_from(opts),
        temperature=opts["temperature"],
        top_k=opts["top_k"],
        top_p=opts["top_p"],
        min_p=opts["min_p"],
        seed=opts["seed"],
        max_tokens=opts["max_tokens"],
        stop=tuple(opts["stop"]),
        repeat_penalty=opts["repeat_penalty"],
        repeat_last_n=opts["repeat_last_n"],
        presence_penalty=opts["presence_penalty"],
        frequency_penalty=opts["frequency_penalty"],
    )


def pick_models(pair: str | None, target: str | None, draft: str | None) -> tuple[str, str | None, Any]:
    """Target and draft references from --pair/--target/--draft; with neither, the registry's default pair."""
    draft_len_hint: Any = None
    if target is None:
        from edgespec.models.registry import resolve_pair

        chosen = resolve_pair(pair)
        target = chosen.target
        if draft is None:
            draft = chosen.draft
        draft_len_hint = chosen.draft_len
    elif pair is not None:
        raise click.UsageError("use either --pair or --target/--draft, not both")
    elif draft is None:
        draft, draft_len_hint = default_draft(target)
    if draft is not None and draft.lower() == "none":
        draft = None
    return target, draft, draft_len_hint


def default_draft(target: str) -> tuple[str, Any]:
    """The draft for a target named without --draft: its registry pair's draft (and draft length), else 'auto'."""
    from edgespec.models.registry import load_registry

    registry = load_registry()
    pairs = sorted((p for p in registry.pairs.values() if p.target == target), key=lambda p: not p.default)
    return (pairs[0].draft, pairs[0].draft_len) if pairs else ("auto", None)


def load_options(opts: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of :func:`edgespec.api.load` that come straight from :func:`model_options`."""
    return {
        "n_ctx": opts["n_ctx"],
        "n_gpu_layers": opts["n_gpu_layers"],
        "n_gpu_layers_draft": opts["n_gpu_layers_draft"],
        "n_threads": opts["threads"],
        "lookup": opts["lookup"],
        "p_min": opts["p_min"],
        "bit_exact": opts["bit_exact"],
        "rpc": opts["rpc"],
        "rpc_draft": opts["rpc_draft"],
    }


def load_runtime(opts: dict[str, Any], *, quiet: bool = False, parallel: int = 1, **more: Any):
    """Load the models the options name, with a progress bar per model on a terminal; ``more``: further keyword
    arguments of :func:`edgespec.api.load` (serve's suffix cache)."""
    from tqdm import tqdm

    from edgespec.api import load

    target, draft, recommended = pick_models(opts["pair"], opts["target"], opts["draft"])
    draft_len = opts["draft_len"] if opts["draft_len"] is not None else (recommended or "auto")
    bars: dict[str, tqdm] = {}

    def progress(stage: str, fraction: float) -> None:
        if quiet:
            return
        bar = bars.get(stage)
        if bar is None:
            bar = bars[stage] = tqdm(
                total=100,
                desc=f"loading {stage}",
                unit="%",
                leave=False,
                file=sys.stderr,
                bar_format="{desc}: {percentage:3.0f}%|{bar}|",
                disable=not sys.stderr.isatty(),  # no escape sequences in logs and pipes
            )
        bar.update(int(fraction * 100) - bar.n)

    try:
        runtime = load(
            target,
            draft,
            draft_len=draft_len,
            parallel=parallel,
            progress=progress,
            show_fetch_progress=not quiet,
            **load_options(opts),
            **more,
        )
    finally:
        for bar in bars.values():
            bar.close()
    if runtime.draft_choice is not None:
        click.echo(runtime.draft_choice, err=True)
    if runtime.parallel_note is not None:
        click.echo(runtime.parallel_note, err=True)
    if not quiet:
        click.echo(describe_load(runtime), err=True)
    return runtime


def describe_load(runtime) -> str:
    """The load line: what runs where."""
    t, d = runtime.target, runtime.draft
    line = f"target {t.name} on {t.placement}" + (" (bit-exact)" if t.bit_exact else "")
    return line + (f" | draft {d.name} on {d.placement}" if d is not None else " | no draft model")


def describe_stats(s: Stats) -> str:
    """One line for stderr: speed, acceptance, and where the time went."""
    return (
        f"{s.generated} tokens in {s.t_decode:.2f}s: {s.tokens_per_second:.1f} tok/s | "
        f"drafted {s.drafted}, accepted {s.accepted} ({s.acceptance_rate:.0%}"
        + (f"; {s.forced} forced by the constraint" if s.forced else "")
        + (f"; from the prompt {s.lookup_accepted}/{s.lookup_drafted}, from earlier replies "
           f"{s.cache_accepted}/{s.cache_drafted}" if s.cache_drafted else "")
        + "), "
        f"{s.tokens_per_verify:.2f} tokens/verify over {s.rounds} verifies | "
        f"prefill {s.prefilled_tokens}/{s.prompt_tokens} tokens {s.t_prefill:.2f}s, draft {s.t_draft:.2f}s, "
        f"verify {s.t_verify:.2f}s, sampling {s.t_sample:.3f}s, other {s.t_other:.3f}s | "
        f"outside llama.cpp {s.outside_ms_per_token:.3f} ms/token ({s.python_overhead:.1%}); "
        f"sampling: {s.sampling_path}"
        + (f" | constraint {1e3 * s.t_constraint / max(s.generated, 1):.3f} ms/token" if s.t_constraint else "")
        + (f" ({s.rereads} constrained rows read again whole)" if s.rereads else "")
    )
