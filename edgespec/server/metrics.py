"""Prometheus counters under the names llama-server (``llamacpp:*``) and vLLM (``vllm:*``) use, as ``edgespec:*``.

The spec-decode counters follow vLLM's meaning: a *draft* is a round that verified at least one drafted token;
``num_accepted_tokens_per_pos{position=i}`` counts the rounds whose i-th drafted token (from 0) was accepted.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from edgespec.server.worker import GenerationWorker, Job

CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    """A registry of its own (not the process-wide default), so two servers in one process do not collide."""

    def __init__(self, worker: GenerationWorker) -> None:
        self.registry = registry = CollectorRegistry()
        self.prompt_tokens = Counter(
            "edgespec:prompt_tokens", "Prompt tokens decoded (a reused KV prefix is not counted).", registry=registry
        )
        self.tokens_predicted = Counter(
            "edgespec:tokens_predicted", "Tokens generated (an end-of-generation token included).", registry=registry
        )
        self.requests_cancelled = Counter(
            "edgespec:requests_cancelled",
            "Requests stopped because their client disconnected, while running or while waiting.",
            registry=registry,
        )
        self.num_drafts = Counter(
            "edgespec:spec_decode_num_drafts", "Rounds that verified at least one drafted token.", registry=registry
        )
        self.num_draft_tokens = Counter(
            "edgespec:spec_decode_num_draft_tokens", "Drafted tokens sent to the target to verify.", registry=registry
        )
        self.num_accepted_tokens = Counter(
            "edgespec:spec_decode_num_accepted_tokens", "Drafted tokens the target accepted.", registry=registry
        )
        self.accepted_per_pos = Counter(
            "edgespec:spec_decode_num_accepted_tokens_per_pos",
            "Rounds whose drafted token at this position (from 0) was accepted.",
            ["position"],
            registry=registry,
        )
        # The free drafts by source: copied from the request's own text (prompt lookup) or from earlier replies (the
        # suffix cache); the counters above count every drafter's.
        self.source_draft_tokens = Counter(
            "edgespec:spec_decode_num_draft_tokens_by_source",
            "Drafted tokens copied from the request's own text (lookup) or from earlier replies (cache).",
            ["source"],
            registry=registry,
        )
        self.source_accepted_tokens = Counter(
            "edgespec:spec_decode_num_accepted_tokens_by_source",
            "Of those, the tokens the target accepted.",
            ["source"],
            registry=registry,
        )
        for source in ("lookup", "cache"):  # present from the start, at 0
            self.source_draft_tokens.labels(source=source)
            self.source_accepted_tokens.labels(source=source)
        processing = Gauge(
            "edgespec:requests_processing", "Requests being generated (up to --parallel).", registry=registry
        )
        processing.set_function(lambda: worker.processing)
        deferred = Gauge("edgespec:requests_deferred", "Requests waiting in the queue.", registry=registry)
        deferred.set_function(lambda: worker.waiting)
        # The batch: running totals (divide rows and sequences by decodes for the averages per decode).
        for name, attribute, text in (
            ("decodes", "steps", "Target decodes that verified requests' rounds (one per step of the batch)."),
            ("decode_rows", "step_rows", "Rows those decodes scored: pending tokens plus drafted tokens."),
            ("decode_sequences", "step_sequences", "Requests those decodes carried, summed over the decodes."),
        ):
            gauge = Gauge(f"edgespec:batch_{name}", text, registry=registry)
            gauge.set_function(lambda attribute=attribute: _engine_count(worker, attribute))

    def record(self, job: Job) -> None:
        """A job left the server (an observer of :class:`GenerationWorker`; called from its thread)."""
        if job.cancelled:
            self.requests_cancelled.inc()
        if job.outcome is None:
            return
        self.num_drafts.inc(job.outcome.draft_rounds)
        for finished in job.outcome.choices:  # n > 1: every choice's tokens
            stats = finished.stats
            self.prompt_tokens.inc(stats.prefilled_tokens)
            self.tokens_predicted.inc(stats.generated)
            self.num_draft_tokens.inc(stats.drafted)
            self.num_accepted_tokens.inc(stats.accepted)
            for source, drafted, accepted in (
                ("lookup", stats.lookup_drafted, stats.lookup_accepted),
                ("cache", stats.cache_drafted, stats.cache_accepted),
            ):
                self.source_draft_tokens.labels(source=source).inc(drafted)
                self.source_accepted_tokens.labels(source=source).inc(accepted)
            # accepted_per_round[k] rounds accepted exactly k, so position i was accepted in every round with k > i.
            hist = stats.accepted_per_round
            for position in range(len(hist) - 1):
                accepted_here = sum(hist[position + 1 :])
                if accepted_here:
                    self.accepted_per_pos.labels(position=str(position)).inc(accepted_here)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _engine_count(worker: GenerationWorker, attribute: str) -> float:
    loaded = getattr(worker, "loaded", None)
    return float(getattr(loaded.runtime.engine, attribute, 0)) if loaded is not None else 0.0
