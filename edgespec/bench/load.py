"""``edgespec bench --concurrency 1,2,4``: the suite's prompts sent by N clients at once, per strategy.

For each concurrency level N, each strategy gets one engine with N lanes on the same loaded models (loaded for the
largest N) and warm-up requests (one per readout the runs use, so that auto's cost calibration is not timed); then,
for each task class, N client threads take the class's prompts (repeated until there are at least 2N, two waves,
at N > 1) from a shared list, one request after another, as a closed loop. Every cache is
emptied before each run, so that the time to first token includes the prompt's prefill for every strategy and
peer alike. Reported per (level, class, strategy): total tok/s (tokens over the run's wall time), per-request tok/s
(each request's tokens over its own time from first token to last), time to first token p50/p95 (from the
request's start), the acceptance rate and where sampling ran.

A single class's ratio at N > 1 swings widely from run to run on a shared 2-core machine (docs/benchmarks.md, "How
to read them"): with ``repeats`` > 1 each class runs that many rounds of the engine's strategies (plain among them),
their order rotating each round so that no strategy always goes first (or last) in the machine's drift; the report
(:mod:`edgespec.bench.load_report`) pools the rounds (tokens over wall time) and gives the spread of the rounds' own
ratios to plain beside it. The references and peers (``auto-serial``, llama-server, ``edgespec serve``) run in the
first round only: a ratio to plain that must tell 5 % apart needs the rounds, a server's time to first token does
not, and each of them would add a run per round and class.

At levels above 1, ``auto-serial`` is auto with one lane, which the N clients share one request at a time: what a
server without batching gives them (time to first token includes the wait).

llama.cpp's own server is a peer when there is one (``llama-server`` on the PATH, else the one ``make llama-server``
builds: :mod:`edgespec.llama_server_build`): started per level with ``-np N`` (continuous batching over a unified KV
cache), plain, with the draft model (``-md``) and with each of its n-gram drafters (``--spec-type ngram-mod``, one
hash pool every slot shares and keeps across requests, and ``ngram-cache``), fed the same prompt tokens through its
``/completion`` endpoint with prompt caching off. A server runs the classes in order, as auto does: what its n-gram
pool keeps from a class's earlier requests drafts the later ones, as auto's suffix cache does. With ``serve``,
``edgespec serve`` is one too, on the same model files: ``--parallel N`` (auto), and at levels above 1
``--parallel 1``, the server that takes one request at a time; fed through ``/v1/completions``, so the HTTP layer,
its worker and its streaming are in the times.

No run reuses a prompt's KV: the engines' requests are sent with ``cache_prompt=False``, the servers' too, so that a
class's repeated prompts (its second wave) are prefilled again, as the first were. auto's suffix cache is emptied
before each run: a class drafts from its own earlier replies only, never from another class's or from an earlier
round's replies to the same prompts.

Ratios are measured side by side in one run; nothing here asserts a time.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgespec import llama_server_build
from edgespec.bench.strategies import WARMUP_TOKENS, engine_for, parse_strategies
from edgespec.bench.tables import percentile
from edgespec.bench.workloads import Task, prompt_job
from edgespec.errors import EdgespecError

if TYPE_CHECKING:
    from edgespec.engine import Engine
    from edgespec.models.backend import Model
    from edgespec.sampling import SamplingParams

LLAMA_SERVER = "llama-server"
PEER_PLAIN, PEER_DRAFT = "llama-server", "llama-server-draft"
# llama-server's n-gram drafters, by its --spec-type names
NGRAM_TYPES = ("ngram-mod", "ngram-cache")
PEER_NGRAM = {f"llama-server-{t}": t for t in NGRAM_TYPES}
LLAMA_PEERS = (PEER_PLAIN, PEER_DRAFT, *PEER_NGRAM)
SERVE, SERVE_SERIAL = "edgespec-serve", "edgespec-serve-1"  # edgespec serve --parallel N, and --parallel 1
HTTP_PEERS = (*LLAMA_PEERS, SERVE, SERVE_SERIAL)
SERIAL = "auto-serial"  # auto on one lane: the requests wait for each other
SERVER_START_SECONDS = 180.0  # loading both models on a slow machine
REQUEST_SECONDS = 600.0


@dataclass
class Request:
    """One request's timeline, seconds from the run's start."""

    start: float
    first: float | None = None  # when its first token arrived
    end: float = 0.0
    generated: int = 0
    drafted: int = 0
    accepted: int = 0
    sampling_path: str = ""


@dataclass
class LoadRecord:
    level: int
    task: str
    strategy: str
    wall: float  # the run's seconds, first request's start to last request's end
    requests: list[Request] = field(default_factory=list)
    round: int = 0  # which of the class's rounds (see ``repeats``)

    @property
    def generated(self) -> int:
        return sum(r.generated for r in self.requests)

    @property
    def total_rate(self) -> float:
        return self.generated / self.wall if self.wall > 0 else 0.0

    @property
    def per_request_rate(self) -> float:
        rates = [r.generated / (r.end - r.first) for r in self.requests if r.first is not None and r.end > r.first]
        return sum(rates) / len(rates) if rates else 0.0

    def ttft(self, q: float) -> float | None:
        return percentile([r.first - r.start for r in self.requests if r.first is not None], q)

    @property
    def acceptance(self) -> float | None:
        drafted = sum(r.drafted for r in self.requests)
        return sum(r.accepted for r in self.requests) / drafted if drafted else None

    @property
    def sampling_path(self) -> str:
        return ", ".join(sorted({r.sampling_path for r in self.requests if r.sampling_path}))


# A runner generates one request and fills in its Request (from its own thread; several run at once).
Runner = Callable[[list[int], "SamplingParams", Request, float], None]


def engine_runner(engine: Engine) -> Runner:
    from edgespec.events import Finished

    def run(prompt: list[int], params: SamplingParams, request: Request, t0: float) -> None:
        for event in engine.stream(prompt, params, cache_prompt=False):
            if request.first is None and event.tokens:
                request.first = time.perf_counter() - t0
            if isinstance(event, Finished):
                s = event.stats
                request.generated, request.drafted, request.accepted = s.generated, s.drafted, s.accepted
                request.sampling_path = s.sampling_path
        request.end = time.perf_counter() - t0

    return run


Job = tuple[list[int], Any]  # a prompt's tokens and the constraint its reply is held to (a Grammar, or None)


def closed_loop(runner: Runner, prompts: Sequence[Job], clients: int, params: SamplingParams) -> LoadRecord:
    """``clients`` threads take the prompts in order, one request at a time each, until none is left (each with its
    own constraint, if it has one)."""
    queue = list(reversed(prompts))
    lock = threading.Lock()
    record = LoadRecord(0, "", "", 0.0)
    errors: list[BaseException] = []
    t0 = time.perf_counter()

    def client() -> None:
        while True:
            with lock:
                if not queue or errors:
                    return
                prompt, grammar = queue.pop()
                request = Request(time.perf_counter() - t0)
                record.requests.append(request)
            try:
                runner(prompt, params if grammar is None else _replace(params, constraint=grammar), request, t0)
            except BaseException as error:  # noqa: BLE001  # re-raised on the calling thread
                errors.append(error)
                return

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(REQUEST_SECONDS * len(prompts))
    if errors:
        raise errors[0]
    if any(t.is_alive() for t in threads):
        raise EdgespecError("a bench client did not finish in time")
    record.wall = max((r.end for r in record.requests), default=0.0)
    return record


def run_load_bench(
    target: Model,
    draft: Model | None,
    tasks: Sequence[Task],
    strategies: Sequence[str],
    params: SamplingParams,
    levels: Sequence[int],
    *,
    lookup_len: int,
    p_min: float = 0.0,
    peers: bool = True,
    repeats: int = 1,
    on_run: Callable[[LoadRecord], None] | None = None,
    serve: bool = False,
) -> tuple[list[LoadRecord], list[str]]:
    """Every (level, class, strategy, round) run, and notes on what was skipped (a peer not on PATH).

    Only the engine's strategies run every round; the references and peers (``auto-serial``, llama-server,
    ``edgespec serve``) run in the first. ``serve``: ``edgespec serve`` as a peer (a second copy of the models in
    memory)."""
    names = [s for s in parse_strategies(strategies, has_draft=draft is not None) if not s.startswith("llama-cpp")]
    prompts = {t.name: [prompt_job(target, p) for p in t.prompts] for t in tasks}
    notes: list[str] = []
    # llama-server takes a JSON schema (its json_schema field), not llguidance's grammars (a tool call's)
    peerless = {t.name for t in tasks if any(p.tools is not None for p in t.prompts)}
    binary = llama_server_build.find() if peers else None
    if peers and binary is None:
        notes.append(f"{LLAMA_SERVER} is not on PATH and not built (make llama-server): its peer rows are skipped")
    if binary is not None and any(p.json_schema is not None for t in tasks for p in t.prompts):
        notes.append(
            f"{LLAMA_SERVER} gets each JSON schema as its json_schema field: its grammar lets the model choose the "
            "whitespace, where edgespec fixes it (', ' and ': '), so the two decode under slightly different rules"
        )
    records: list[LoadRecord] = []
    warm = _replace(params, max_tokens=WARMUP_TOKENS)
    # A warm-up per way of reading the verify's rows that the runs will use (a constrained reply reads top-k
    # candidates where a greedy one reads the argmax): auto calibrates its decode costs once per readout, seconds
    # that a server pays once per machine (its cost cache keeps them) and a timed run must not.
    all_jobs = [job for jobs in prompts.values() for job in jobs]
    warmups = [all_jobs[0], *[job for job in all_jobs if job[1] is not None][:1]]
    for level in levels:
        if level > target.n_seq:
            raise EdgespecError(f"concurrency {level}: the models were loaded for {target.n_seq} sequences")
        runners: dict[str, Runner] = {}
        engines: dict[str, Engine] = {}
        for name in names:
            engines[name] = engine = engine_for(name, target, draft, lookup_len, p_min, parallel=level)
            runners[name] = engine_runner(engine)
        if level > 1 and "auto" in names:
            # What a server that takes one request at a time gives the same clients: they queue.
            runners[SERIAL] = engine_runner(engine_for("auto", target, draft, lookup_len, p_min, parallel=1))
        servers: list[HttpPeer] = []
        try:
            if binary is not None:
                for name in LLAMA_PEERS:
                    if name == PEER_DRAFT and draft is None:
                        continue
                    server = LlamaServer(
                        binary, target, draft if name == PEER_DRAFT else None, level, spec_type=PEER_NGRAM.get(name)
                    )
                    servers.append(server)
                    runners[name] = server.runner()
            if serve:
                for name, parallel in ((SERVE, level), (SERVE_SERIAL, 1)):
                    if name == SERVE_SERIAL and level == 1:
                        continue
                    server = EdgespecServer(target, draft, parallel, clients=level)
                    servers.append(server)
                    runners[name] = server.runner()
            for name, runner in runners.items():  # first calls pay one-off costs (and auto's calibration)
                for job in warmups if name not in LLAMA_PEERS else warmups[:1]:
                    _clear(target, draft)
                    closed_loop(runner, [job] * level, level, warm)
            for i, task in enumerate(tasks):
                jobs = prompts[task.name]
                # At N > 1 two waves at least: a class's first N requests start together and all wait for their
                # prefills, the next ones join requests in rounds, as a server's do; a single wave's total is
                # decided by its slowest prefill, which moves a lot from run to run.
                want = max(len(jobs), level if level == 1 else 2 * level)
                jobs = (jobs * -(-want // len(jobs)))[:want]
                for round_ in range(repeats):
                    names_now = [n for n in runners if round_ == 0 or n in names]
                    turn = (i + round_) % len(names_now)
                    for name in names_now[turn:] + names_now[:turn]:
                        if task.name in peerless and name in HTTP_PEERS:
                            server_name = LLAMA_SERVER if name in LLAMA_PEERS else "edgespec serve"
                            note = f"{task.name}: {server_name} is not run (its tool-call prompts need a grammar)"
                            if note not in notes:
                                notes.append(note)
                            continue
                        _clear(target, draft)
                        if name in engines and engines[name].suffix_cache is not None:
                            engines[name].suffix_cache.clear()
                        record = closed_loop(runners[name], jobs, level, params)
                        record.level, record.task, record.strategy, record.round = level, task.name, name, round_
                        records.append(record)
                        if on_run is not None:
                            on_run(record)
        finally:
            for server in servers:
                server.close()
    return records, notes


def _replace(params: SamplingParams, **changes: Any) -> SamplingParams:
    from dataclasses import replace

    return replace(params, **changes)


def _clear(*models: Model | None) -> None:
    """Empty every sequence's KV, so that the next run prefills its prompts as a peer does."""
    for model in models:
        if model is not None:
            for slot in model.slots:
                slot.truncate(0)


# ----- servers as peers ---------------------------------------------------------------------------------------
class HttpPeer:
    """A server process on a free port of 127.0.0.1, ready once its ``/health`` answers 200; closed by the bench."""

    name = "server"

    def _start(self, args_for_port: Callable[[int], list[str]]) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.process = subprocess.Popen(args_for_port(self.port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        self._wait_ready()

    def _wait_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + SERVER_START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EdgespecError(f"{self.name} exited with code {self.process.returncode} while loading")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.close()
        raise EdgespecError(f"{self.name} did not become ready in {SERVER_START_SECONDS:.0f} s")

    def runner(self) -> Runner:
        raise NotImplementedError

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def _gpu_layers(model: Model) -> str:
    return str(model.n_gpu_layers if model.n_gpu_layers >= 0 else 999)


class LlamaServer(HttpPeer):
    """llama.cpp's ``llama-server`` on the target (and draft) file with ``-np N``; ``spec_type``: one of its n-gram
    drafters (``--spec-type``), at its own defaults."""

    name = LLAMA_SERVER

    def __init__(
        self, binary: str, target: Model, draft: Model | None, parallel: int, spec_type: str | None = None
    ) -> None:
        def args(port: int) -> list[str]:
            cmd = [
                binary, "-m", str(target.path), "--host", "127.0.0.1", "--port", str(port),
                "-np", str(parallel), "-c", str(target.n_ctx * parallel), "-t", str(target.n_threads),
                "-ngl", _gpu_layers(target),
            ]  # fmt: skip
            if draft is not None:
                cmd += ["-md", str(draft.path), "-ngld", _gpu_layers(draft)]
            if spec_type is not None:
                cmd += ["--spec-type", spec_type]
            return cmd

        self._start(args)

    def runner(self) -> Runner:
        import httpx

        def run(prompt: list[int], params: SamplingParams, request: Request, t0: float) -> None:
            body = {
                "prompt": prompt, "n_predict": params.max_tokens, "temperature": params.temperature,
                "top_k": params.top_k, "top_p": params.top_p, "min_p": params.min_p, "seed": params.seed or 0,
                "stream": True, "cache_prompt": False,
            }  # fmt: skip
            if params.constraint is not None:  # its own constrained decoding, from the same schema
                body["json_schema"] = json.loads(params.constraint.text)
            with httpx.stream("POST", self.url + "/completion", json=body, timeout=REQUEST_SECONDS) as response:
                response.raise_for_status()
                for line in response.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = json.loads(line[6:])
                    if request.first is None and data.get("content"):
                        request.first = time.perf_counter() - t0
                    if data.get("stop"):
                        timings = data.get("timings") or {}
                        request.generated = int(data.get("tokens_predicted") or timings.get("predicted_n") or 0)
                        request.drafted = int(timings.get("draft_n") or 0)
                        request.accepted = int(timings.get("draft_n_accepted") or 0)
            request.end = time.perf_counter() - t0
            request.sampling_path = "llama-server"

        return run


class EdgespecServer(HttpPeer):
    """``edgespec serve --parallel N`` on the bench's model files and settings (auto speculation), in a process of its
    own, fed through ``/v1/completions`` with prompt caching off."""

    name = "edgespec serve"

    def __init__(self, target: Model, draft: Model | None, parallel: int, clients: int = 1) -> None:
        def args(port: int) -> list[str]:
            cmd = [
                sys.executable, "-m", "edgespec", "serve", "--target", str(target.path), "--port", str(port),
                "--parallel", str(parallel), "--n-ctx", str(target.n_ctx), "--threads", str(target.n_threads),
                "-ngl", _gpu_layers(target), "--draft-len", "auto",
                "--max-queue", str(max(8, clients)),  # room for every client to wait (the default is 8)
            ]  # fmt: skip
            cmd += ["--draft", "none"] if draft is None else ["--draft", str(draft.path), "-ngld", _gpu_layers(draft)]
            return cmd + (["--bit-exact"] if getattr(target, "bit_exact", False) else [])

        self._start(args)

    def runner(self) -> Runner:
        import httpx

        def run(prompt: list[int], params: SamplingParams, request: Request, t0: float) -> None:
            body: dict[str, Any] = {
                "prompt": prompt, "max_tokens": params.max_tokens, "temperature": params.temperature,
                "top_k": params.top_k, "top_p": params.top_p, "min_p": params.min_p, "seed": params.seed or 0,
                "stream": True, "cache_prompt": False,
            }  # fmt: skip
            if params.constraint is not None:  # a schema class (tool-call classes are not sent: see peerless)
                schema = json.loads(params.constraint.text)
                body["response_format"] = {"type": "json_schema", "json_schema": {"name": "bench", "schema": schema}}
            with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=REQUEST_SECONDS) as response:
                response.raise_for_status()
                for line in response.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    data = json.loads(line[6:])
                    if "error" in data:
                        raise EdgespecError(f"edgespec serve: {data['error'].get('message', data['error'])}")
                    if request.first is None and any(c.get("text") for c in data.get("choices", ())):
                        request.first = time.perf_counter() - t0
                    timings = data.get("timings")
                    if timings:
                        request.generated = int(timings.get("predicted_n") or 0)
                        request.drafted = int(timings.get("draft_n") or 0)
                        request.accepted = int(timings.get("draft_n_accepted") or 0)
            request.end = time.perf_counter() - t0
            request.sampling_path = "edgespec serve"

        return run


def default_levels(text: str) -> list[int]:
    """``"1,2,4"`` → ``[1, 2, 4]`` (each 1..16)."""
    try:
        levels = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise EdgespecError(f"--concurrency takes comma-separated counts like 1,2,4, got {text!r}") from None
    if not levels or any(not 1 <= n <= 16 for n in levels):
        raise EdgespecError(f"--concurrency levels must be 1..16, got {text!r}")
    return levels

