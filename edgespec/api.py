"""The public Python API: load a target (and a draft) once, then stream, generate and chat many times.

    import edgespec
    rt = edgespec.load("qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b")
    for event in rt.stream("def quicksort(xs):", edgespec.SamplingParams(temperature=0)):
        print(event.text, end="", flush=True)

CLI, TUI and bench are thin clients of :class:`Runtime`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from edgespec.calibrate import CostCache
from edgespec.drafters.suffix_cache import DEFAULT_MAX_TOKENS, SuffixCache, SuffixCacheFileError
from edgespec.engine import ENGINE_SCOPE, MAX_PARALLEL, Engine
from edgespec.errors import EdgespecError, InvalidParameterError
from edgespec.events import Chunk, Event, Finished
from edgespec.models.backend import Model, auto_gpu_layers, auto_layers_beside_servers, gpu_offload_supported
from edgespec.models.chat_template import render
from edgespec.paths import cost_cache_path
from edgespec.sampling import SamplingParams
from edgespec.tools import template_tool_calls

__all__ = ["Chunk", "Event", "Finished", "ModelInfo", "Runtime", "SamplingParams", "load"]

log = logging.getLogger(__name__)

# What a runtime's suffix cache drafts from (load's suffix_cache; `edgespec serve --suffix-cache`): "global", every
# earlier request's output; "key", only those of requests given the same cache_scope (a request given none leaves
# the cache alone); "off", none.
SUFFIX_CACHE_MODES = ("global", "key", "off")
GLOBAL_SCOPE = "global"  # the one scope of a runtime in "global" mode


@dataclass(frozen=True)
class ModelInfo:
    """What the status line shows about a loaded model."""

    name: str
    path: str
    description: str  # "arch params quant", e.g. "qwen2 1.78B params Q4_K - Medium" (llama_model_n_params)
    n_ctx: int
    n_gpu_layers: int  # as loaded (auto resolved); -1 = all, 0 = CPU
    on_gpu: bool  # layers offloaded and the build supports it
    placement: str  # "CPU", or the GPU and how many layers are on it
    bit_exact: bool = False  # loaded without weight repacking (see edgespec.models.backend.Model)
    n_params: int = 0  # llama_model_n_params


def _info(model: Model, name: str) -> ModelInfo:
    return ModelInfo(
        name=name,
        path=str(model.path),
        description=model.description,
        n_ctx=model.n_ctx,
        n_gpu_layers=model.n_gpu_layers,
        on_gpu=model.n_gpu_layers != 0 and (gpu_offload_supported() or bool(model.rpc)),
        placement=model.placement,
        bit_exact=model.bit_exact,
        n_params=model.n_params,
    )


class Runtime:
    """A loaded target (+ optional draft model) and the engine that drives them."""

    draft_choice: str | None = None  # with draft="auto": the one line saying which draft was chosen and why
    parallel_note: str | None = None  # when fewer requests at once were loaded than asked for: why

    def __init__(
        self,
        engine: Engine,
        *,
        target_name: str | None = None,
        draft_name: str | None = None,
        suffix_cache_file: SuffixCacheFile | None = None,
    ) -> None:
        self.engine = engine
        self.suffix_cache_file = suffix_cache_file  # where the engine's suffix cache is saved on close
        self.target = _info(engine.target, target_name or engine.target.name)
        self.draft = (
            _info(engine.draft_model, draft_name or engine.draft_model.name) if engine.draft_model else None
        )
        self._cancel: threading.Event | None = None

    # ----- generation ----------------------------------------------------------------------------------------
    def stream(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        *,
        cancel: threading.Event | None = None,
        draft_len: int | str | None = None,
        lookup: bool | None = None,
        cache_prompt: bool = True,
        cache_scope: Hashable | None = ENGINE_SCOPE,
    ) -> Iterator[Event]:
        """Yield :class:`Chunk` events as tokens are committed, then one :class:`Finished`.

        A string prompt is tokenized with the model's special tokens (BOS where the model wants one).
        ``cancel`` stops this request after its current round (:meth:`cancel` stops every running one); the
        runtime stays usable. Several threads may stream at once: a runtime loaded with ``parallel=N`` runs up to
        N requests in the same decodes, and the rest wait their turn. ``draft_len`` and ``lookup`` override
        :meth:`set_draft_len` and :meth:`set_lookup` for this request only. ``cache_prompt=False`` decodes the whole
        prompt again even where the KV cache already holds part of it (llama-server's ``cache_prompt``).
        ``cache_scope``: which earlier outputs this request may draft from in the suffix cache, and joins when it
        ends (any str, int or tuple of them; None: none); not given, the runtime's one scope (``suffix_cache="global"``)
        or none (``"key"``).
        """
        params = params or SamplingParams()
        tokens = self.engine.target.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        self._cancel = cancel or threading.Event()
        return self.engine.stream(
            tokens, params, cancel=self._cancel, draft_len=draft_len, lookup=lookup, cache_prompt=cache_prompt,
            cache_scope=cache_scope,
        )  # fmt: skip

    def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        *,
        cancel: threading.Event | None = None,
        on_chunk: Callable[[Chunk], None] | None = None,
        cache_scope: Hashable | None = ENGINE_SCOPE,
    ) -> Finished:
        """Run to the end and return the :class:`Finished` event (text, tokens, stats); ``cache_scope`` as for
        :meth:`stream`."""
        return _drain(self.stream(prompt, params, cancel=cancel, cache_scope=cache_scope), on_chunk)

    def generate_many(
        self,
        prompts: Sequence[str | Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> list[Finished]:
        """Generate for every prompt, up to ``parallel`` of them in the same decodes, on the calling thread; the
        results come back in the prompts' order. ``params``: one for all, or one per prompt (each request keeps
        its own seed, so a seeded request gives what it gives alone)."""
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise InvalidParameterError(f"{len(prompts)} prompts but {len(params)} sampling settings")
        todo = list(enumerate(zip(prompts, params, strict=True)))[::-1]
        results: list[Finished | None] = [None] * len(prompts)
        running: dict[int, Iterator[Event]] = {}
        try:
            while todo or running:
                while todo and len(running) < self.engine.parallel:
                    i, (prompt, p) = todo.pop()
                    running[i] = self.stream(prompt, p, cancel=cancel)
                # One event from each in turn: whichever stream runs out of events steps all of them.
                for i, events in list(running.items()):
                    event = next(events)
                    if isinstance(event, Finished):
                        results[i] = event
                        del running[i]
        finally:
            for events in running.values():
                events.close()  # type: ignore[attr-defined]
        return [r for r in results if r is not None]

    def chat(
        self,
        messages: Sequence[dict],
        params: SamplingParams | None = None,
        *,
        cancel: threading.Event | None = None,
        tools: Sequence[dict] | None = None,
        cache_scope: Hashable | None = ENGINE_SCOPE,
    ) -> Iterator[Event]:
        """Stream the assistant's reply to ``messages`` (dicts with ``role`` and ``content``). ``tools`` (OpenAI's
        shape) go to the model's chat template; :func:`edgespec.tools.parse_calls` reads calls out of the reply and
        :func:`edgespec.tools.call_grammar` makes a constraint that forces one.

        The whole conversation is rendered with the model's chat template each turn, but only the tokens after
        the longest prefix already in the KV caches are decoded: a new turn costs its new tokens, not the history.
        ``cache_scope`` as for :meth:`stream`.
        """
        return self.stream(self.render_chat(messages, tools), params, cancel=cancel, cache_scope=cache_scope)

    def render_chat(self, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> list[int]:
        """``messages`` in the model's chat template, tokenized; ``tools`` (OpenAI's shape) go to the template."""
        model = self.engine.target
        bos = model.token_text(model.vocab.bos) if model.vocab.bos >= 0 else ""
        eos = model.token_text(model.vocab.eos) if model.vocab.eos >= 0 else ""
        # OpenAI-shaped history (an assistant's tool_calls, arguments as JSON text, content null) as templates take it
        messages = template_tool_calls(
            [{**m, "content": m.get("content") or ""} if isinstance(m, dict) else m for m in messages]
        )
        text = render(messages, model.chat_template, bos_token=bos, eos_token=eos, tools=tools)
        # The template writes BOS itself when the model wants it; do not let the tokenizer add a second one.
        tokens = model.tokenize(text, add_special=not (bos and text.startswith(bos)))
        return tokens

    def cancel(self) -> None:
        """Stop every running request after its current round. Safe from any thread."""
        if self._cancel is not None:
            self._cancel.set()
        self.engine.cancel()

    # ----- facts and settings --------------------------------------------------------------------------------
    @property
    def context_used(self) -> int:
        return len(self.engine.target.kv_tokens)

    @property
    def context_size(self) -> int:
        return self.engine.target.n_ctx

    def count_tokens(self, text: str) -> int:
        return len(self.engine.target.tokenize(text))

    def set_draft_len(self, draft_len: int | str) -> None:
        """``"auto"`` (the controller decides each round) or a fixed γ (0 turns speculation off)."""
        self.engine.set_draft_len(draft_len)

    @property
    def draft_len(self) -> int | str:
        return self.engine.draft_len

    def set_lookup(self, enabled: bool) -> None:
        """Prompt-lookup drafting on or off, between requests (a server switches it per request).

        Only a runtime loaded with ``lookup=True`` has a lookup drafter to switch back on.
        """
        self.engine.set_lookup(enabled)

    @property
    def lookup(self) -> bool:
        """Whether prompt lookup drafts in the next request."""
        return self.engine.lookup

    def close(self) -> None:
        if self.suffix_cache_file is not None and self.engine.suffix_cache is not None:
            self.suffix_cache_file.save(self.engine.suffix_cache)
        self.engine.target.close()
        if self.engine.draft_model is not None:
            self.engine.draft_model.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _drain(events: Iterator[Event], on_chunk: Callable[[Chunk], None] | None = None) -> Finished:
    for event in events:
        if isinstance(event, Finished):
            return event
        if on_chunk is not None:
            on_chunk(event)
    raise EdgespecError("generation ended without a result")  # the engine always ends with Finished


LoadProgress = Callable[[str, float], None]


@dataclass(frozen=True)
class SuffixCacheFile:
    """Where a runtime keeps its suffix cache between processes, and the vocabulary the file's token ids belong to."""

    path: Path
    vocabulary: str  # the target's vocabulary fingerprint (edgespec.models.vocab.fingerprint)

    def load_into(self, cache: SuffixCache) -> None:
        """Fill ``cache`` from the file; one that is damaged or of another vocabulary is reported and left alone (it
        is replaced at the next save), and the cache starts empty."""
        try:
            cache.load(self.path, self.vocabulary)
        except SuffixCacheFileError as error:
            log.warning("%s", error)

    def save(self, cache: SuffixCache) -> None:
        """Write ``cache`` (atomically); a failure is reported, not raised: the runtime is closing."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            cache.save(self.path, self.vocabulary)
        except (OSError, ValueError) as error:
            log.warning("the suffix cache was not saved to %s: %s", self.path, error)


def check_suffix_cache(mode: str, tokens: int) -> None:
    if mode not in SUFFIX_CACHE_MODES:
        raise InvalidParameterError(f"suffix_cache must be one of {', '.join(SUFFIX_CACHE_MODES)}, got {mode!r}")
    if tokens < 1:
        raise InvalidParameterError(f"suffix_cache_tokens must be >= 1, got {tokens}")


def suffix_cache_for(
    mode: str, tokens: int, path: str | Path | None, target_meta: object
) -> tuple[SuffixCache | None, Hashable | None, SuffixCacheFile | None]:
    """The suffix cache of a runtime in ``mode`` (see :data:`SUFFIX_CACHE_MODES`), bounded by ``tokens``, the scope a
    request that names none gets, and the file it starts from and is saved to (``path``; None: kept in memory only)."""
    check_suffix_cache(mode, tokens)
    if mode == "off":
        return None, None, None
    cache = SuffixCache(tokens)
    file = None
    if path is not None:
        from edgespec.models.vocab import fingerprint

        file = SuffixCacheFile(Path(path).expanduser(), fingerprint(target_meta))  # type: ignore[arg-type]
        file.load_into(cache)
    return cache, GLOBAL_SCOPE if mode == "global" else None, file


def load(
    target: str | Path,
    draft: str | Path | None = None,
    *,
    n_ctx: int = 4096,
    n_gpu_layers: int | None = None,
    n_gpu_layers_draft: int | None = None,
    n_threads: int | None = None,
    draft_len: int | str = "auto",
    lookup: bool = True,
    p_min: float = 0.0,
    bit_exact: bool = False,
    parallel: int = 1,
    progress: LoadProgress | None = None,
    show_fetch_progress: bool = True,
    suffix_cache: str = "global",
    suffix_cache_tokens: int = DEFAULT_MAX_TOKENS,
    suffix_cache_path: str | Path | None = None,
    rpc: str | Sequence[str] | None = None,
    rpc_draft: bool = False,
) -> Runtime:
    """Resolve, check and load a target (and optional draft) model.

    ``target``/``draft`` are paths, names from models.toml (fetched when missing), ``hf:ORG/REPO[:QUANT]``
    references or ids of models found on this machine (``edgespec models scan``); ``draft="auto"`` picks the best
    compatible draft among the models here, or none (``Runtime.draft_choice`` says which and why). The GGUF
    headers are checked and the two vocabularies compared *before* any weights load, so a bad pair fails in
    milliseconds.
    ``n_gpu_layers``: layers of the target on the GPU, -1 all, 0 none; None (the default) offloads what fits the
    GPU's free memory, and is 0 on a build without GPU support. ``n_gpu_layers_draft`` likewise for the draft;
    None: what still fits after the target when the target's was None too, else the target's setting.
    ``bit_exact``: load the target so that greedy speculation is token-identical to plain decoding (no CPU weight
    repacking; slower, see :class:`~edgespec.models.backend.Model`).
    ``parallel``: requests served at once (each gets ``n_ctx`` of context of its own; see
    :meth:`Runtime.generate_many` and :meth:`Runtime.stream`); fewer when the KV cache of that many does not fit
    the free memory (``Runtime.parallel_note`` says so).
    ``progress(stage, fraction)`` reports loading.
    ``suffix_cache``: what a request drafts from besides its own text (see :data:`SUFFIX_CACHE_MODES`): the
    runtime's earlier outputs (``"global"``, the default), only those of requests given the same ``cache_scope``
    (``"key"``), or none (``"off"``); ``suffix_cache_tokens`` bounds it. ``suffix_cache_path``: a file it starts
    from and is saved to at :meth:`Runtime.close`, so that a restarted process starts warm (a damaged file, or one
    of another vocabulary, is reported and the cache starts empty).
    ``rpc``: RPC servers (``"host:port"``, several comma-separated or as a list) that take the target's offloaded
    layers before this machine's GPUs (``edgespec rpc-server`` there): with ``n_gpu_layers`` None, as many as fit
    their free memory and the GPUs'. Each server is probed first: one that cannot be reached, or speaks another
    protocol version, is a :class:`~edgespec.models.rpc.RemoteError` naming it. The draft stays on this machine
    (a draft step across the network loses its point) unless ``rpc_draft``.
    """
    if not 1 <= parallel <= MAX_PARALLEL:
        raise InvalidParameterError(f"parallel must be 1..{MAX_PARALLEL}, got {parallel}")
    check_suffix_cache(suffix_cache, suffix_cache_tokens)  # before any model loads
    from edgespec.models.rpc import attached, parse_endpoints

    servers = parse_endpoints(rpc)
    if rpc_draft and not servers:
        raise InvalidParameterError("rpc_draft places the draft on the RPC servers: name them with rpc")
    from edgespec.models.gguf import preflight
    from edgespec.models.registry import resolve_model
    from edgespec.models.vocab import check_vocab_compatible

    target_path = resolve_model(str(target), progress=show_fetch_progress)
    draft_choice = None
    if draft is not None and str(draft) == "auto":
        from edgespec.models.drafts import choose_draft

        chosen = choose_draft(target_path, target_name=None if Path(str(target)).exists() else str(target))
        draft, draft_path, draft_choice = chosen.ref, chosen.path, chosen.line
    else:
        draft_path = resolve_model(str(draft), progress=show_fetch_progress) if draft is not None else None
    target_meta = preflight(target_path)
    if draft_path is not None:
        check_vocab_compatible(target_meta, preflight(draft_path))
    cache, scope, cache_file = suffix_cache_for(suffix_cache, suffix_cache_tokens, suffix_cache_path, target_meta)

    parallel_note = None
    if parallel > 1:
        parallel, parallel_note = _parallel_that_fits(parallel, [p for p in (target_path, draft_path) if p], n_ctx)

    def stage(name: str) -> Callable[[float], None] | None:
        return (lambda f: progress(name, f)) if progress is not None else None

    # The servers' devices (probed and attached before any weights load), their memory offered to the target's layers.
    remote_free = sum(d.free for d in attached(servers))
    if n_gpu_layers is None and servers and not rpc_draft:
        # The target on the servers and the GPUs here; the draft on the GPUs here alone.
        target_need, draft_need = (target_path, n_ctx * parallel), None
        if draft_path is not None:
            draft_need = (draft_path, n_ctx * parallel)
        n_gpu_layers, fitted_draft = auto_layers_beside_servers(target_need, draft_need, remote_free)
        if n_gpu_layers_draft is None:
            n_gpu_layers_draft = fitted_draft
    elif n_gpu_layers is None:
        # Both placed together, the target first; a draft given explicitly keeps its own setting.
        paths = [p for p in (target_path, draft_path) if p is not None]
        fitted = auto_gpu_layers([(p, n_ctx * parallel) for p in paths], extra_free=remote_free)
        n_gpu_layers = fitted[0]
        if n_gpu_layers_draft is None:
            n_gpu_layers_draft = fitted[-1]
    elif n_gpu_layers_draft is None:
        n_gpu_layers_draft = n_gpu_layers if not servers or rpc_draft else 0
    target_model = Model(
        target_path,
        n_ctx=n_ctx,
        n_gpu_layers=n_gpu_layers,
        n_threads=n_threads,
        bit_exact=bit_exact,
        n_seq=parallel,
        rpc=servers,
        progress=stage("target"),
    )
    draft_model = None
    try:
        if draft_path is not None:
            # The draft only proposes, so its kernels do not matter for bit-exactness: it keeps repacking.
            draft_model = Model(
                draft_path,
                n_ctx=n_ctx,
                n_gpu_layers=n_gpu_layers_draft,
                n_threads=n_threads,
                n_seq=parallel,
                rpc=servers if rpc_draft else (),
                progress=stage("draft"),
            )
        engine = Engine(
            target_model,
            draft_model,
            draft_len=draft_len,
            lookup=lookup,
            p_min=p_min,
            cost_cache=CostCache(cost_cache_path()),
            suffix_cache=cache,
            cache_scope=scope,
        )
    except BaseException:
        target_model.close()
        if draft_model is not None:
            draft_model.close()
        raise
    runtime = Runtime(
        engine,
        target_name=str(target) if not Path(str(target)).exists() else None,
        draft_name=(str(draft) if draft is not None and not Path(str(draft)).exists() else None),
        suffix_cache_file=cache_file,
    )
    runtime.draft_choice = draft_choice
    runtime.parallel_note = parallel_note
    return runtime


def _parallel_that_fits(wanted: int, paths: list[Path], n_ctx: int) -> tuple[int, str | None]:
    """``wanted`` sequences, or fewer when their KV caches do not fit the memory free for them: the GPUs' when
    there are any (offloaded KV lives there), else the RAM's, less the weights either way."""
    from edgespec.models.backend import gpu_devices, model_shape
    from edgespec.models.offload import available_memory, parallel_that_fits

    kv = sum(model_shape(p).kv_bytes_per_token * n_ctx for p in paths)
    weights = sum(Path(p).stat().st_size for p in paths)
    gpus = gpu_devices()
    free = sum(d.free for d in gpus) if gpus else available_memory()
    return parallel_that_fits(wanted, kv, None if free is None else max(free - weights, 0))
