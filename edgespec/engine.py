"""The speculative round loop: draft → verify → accept → roll back → update.

State between rounds: the committed tokens ``x[0..n)``. The target's KV holds ``x[0..n-1)``; the last committed
token ``x[n-1]`` is *pending* and opens the next verify batch. Plain decoding is the same loop with γ = 0, so the
baseline, the fallback and the speculative path share every line.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace

from edgespec.drafters.base import Draft, Drafter
from edgespec.drafters.controller import Controller, FixedController, Plan, RoundController
from edgespec.drafters.costs import CostCache, Costs, setup_key, time_decodes
from edgespec.drafters.lookup import LookupDrafter
from edgespec.drafters.model import ModelDrafter
from edgespec.errors import ContextOverflowError, EdgespecError, InvalidParameterError
from edgespec.events import Chunk, Event, Finished, FinishReason, Span, Stats
from edgespec.models.backend import MAX_ROWS, Model
from edgespec.penalties import windows
from edgespec.sampling import Readout, SamplingParams, Scores, Uniforms, Warped, readout_for
from edgespec.text import TextStream
from edgespec.verify import Verdict, verify_greedy, verify_stochastic

# Long drafts only pay in copy streaks (prompt lookup), but there they do: on a CPU a 16-token verify measured
# 6.7x a single step, so a fully accepted one is 2.4x faster than plain decoding.
DEFAULT_MAX_GAMMA = 16
MAX_DRAFT_LEN = 64


def parse_draft_len(value: str | int) -> int | str:
    """``"auto"``, ``"off"`` (= 0) or an integer 0..64, as typed on a command line or in a chat command."""
    text = str(value).strip().lower()
    if text in ("auto", "off"):
        return "auto" if text == "auto" else 0
    if text.isdigit() and int(text) <= MAX_DRAFT_LEN:
        return int(text)
    raise InvalidParameterError(f"draft length must be 'auto', 'off' or an integer 0..{MAX_DRAFT_LEN}, got {value!r}")


class Engine:
    """Generates with a loaded target and optional drafters. One request at a time; reusable across requests.

    ``draft_len``: ``"auto"`` lets the cost-aware controller pick the drafter and γ each round (0 included);
    an integer fixes γ (the draft model if there is one, else prompt lookup; 0 = plain decoding).
    """

    def __init__(
        self,
        target: Model,
        draft: Model | None = None,
        *,
        draft_len: int | str = "auto",
        lookup: bool = True,
        p_min: float = 0.0,
        max_gamma: int = DEFAULT_MAX_GAMMA,
        cost_cache: CostCache | None = None,
    ) -> None:
        self.target = target
        self.draft_model = draft
        self.drafters: dict[str, Drafter] = {}
        if draft is not None:
            self.drafters["model"] = ModelDrafter(draft, p_min=p_min)
        self._lookup = LookupDrafter() if lookup else None
        if self._lookup is not None:
            self.drafters["lookup"] = self._lookup
        self.max_gamma = min(max_gamma, self.gamma_limit)
        self._auto: Controller | None = None  # kept across set_draft_len switches, so its estimates survive
        self._calibrated_for: str | None = None  # the controller has costs measured with readouts of this kind
        self._cost_cache = cost_cache
        self._busy = threading.Lock()
        self._cancel = threading.Event()
        self.set_draft_len(draft_len)

    # ----- configuration -------------------------------------------------------------------------------------
    def set_draft_len(self, draft_len: int | str) -> None:
        """Switch between the adaptive controller (``"auto"``) and a fixed γ (0 = plain decoding).

        A request in flight keeps the settings it started with; the change applies from the next one.
        """
        draft_len = parse_draft_len(draft_len)
        if draft_len == "auto":
            if self._auto is None:
                self._auto = Controller(list(self.drafters), max_gamma=self.max_gamma)
            self.controller: RoundController = self._auto
        else:
            assert isinstance(draft_len, int)
            if draft_len > self.gamma_limit:
                bit_exact = getattr(self.target, "bit_exact", False)
                why = " (bit-exact: llama.cpp's CPU kernels change at wider batches)" if bit_exact else ""
                raise InvalidParameterError(
                    f"draft length {draft_len} is more than this target verifies at once: at most {self.gamma_limit}"
                    + why
                )
            name = "model" if "model" in self.drafters else ("lookup" if "lookup" in self.drafters else None)
            if draft_len and name is None:
                raise InvalidParameterError(
                    f"draft length {draft_len} needs a drafter: load a draft model or turn prompt lookup on"
                )
            self.controller = FixedController(name if draft_len else None, draft_len)
        self.draft_len = draft_len

    @property
    def gamma_limit(self) -> int:
        """The widest draft one verify takes: the target's widest batch (a bit-exact one: 7 rows) less the pending
        token."""
        return getattr(self.target, "max_verify_rows", MAX_ROWS) - 1

    @property
    def headroom(self) -> int:
        """How far past the committed text a verify may reach: the fixed γ, or auto's largest. A request's own
        fixed γ never changes another's."""
        return self.draft_len if isinstance(self.draft_len, int) else self.max_gamma

    def cancel(self) -> None:
        """Stop the running request after its current round (safe from any thread)."""
        self._cancel.set()

    # ----- the loop ------------------------------------------------------------------------------------------
    def stream(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        *,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        """Generate after the prompt tokens; yield a :class:`Chunk` per round and a :class:`Finished` at the end.

        Bad input (an empty prompt, a request that cannot fit the context) raises here, before any work.
        """
        if not prompt:
            raise InvalidParameterError("the prompt is empty")
        if params.logit_bias and params.logit_bias[-1][0] >= self.target.n_vocab:  # sorted by token id
            raise InvalidParameterError(
                f"logit_bias names token {params.logit_bias[-1][0]}: the vocabulary has {self.target.n_vocab} tokens"
            )
        self._check_fits(len(prompt), params.max_tokens)
        return self._locked_run(list(prompt), params, cancel)

    def _locked_run(self, ctx: list[int], params: SamplingParams, cancel: threading.Event | None) -> Iterator[Event]:
        if not self._busy.acquire(blocking=False):
            raise EdgespecError("the engine is busy with another request (one at a time per loaded model)")
        self._cancel.clear()
        try:
            yield from self._run(ctx, params, cancel)
        finally:
            self._busy.release()

    def _run(self, ctx: list[int], params: SamplingParams, cancel: threading.Event | None) -> Iterator[Event]:
        # A settings change (set_draft_len) during this request takes effect with the next one.
        target, drafters, controller = self.target, self.drafters, self.controller
        max_gamma = self.headroom  # a fixed γ drafts exactly that far; auto up to max_gamma
        rng = params.rng()
        # What the verify reads back per row: the argmax or the top-k candidates, selected inside llama.cpp.
        readout = readout_for(params, target.n_vocab)
        n_prompt = len(ctx)
        clock = time.perf_counter
        t_start = clock()
        tally = _Tally(n_prompt, max_gamma, target.readout_path(readout))
        try:
            # Prefill: the KV of everything but the pending last token; a shared prefix is kept, not recomputed.
            tally.prefilled = target.sync(ctx[:-1])
            for drafter in drafters.values():
                drafter.reset(ctx)
            controller.start_request()  # every drafter is in step with the prompt: nothing to catch up
            if controller is self._auto and readout.kind != self._calibrated_for:
                self._calibrate(ctx, controller, max_gamma, readout)
            tally.t_prefill = clock() - t_start
            draft_model, is_eog = self.draft_model, target.is_eog
            busy_at_start = target.busy_seconds + (draft_model.busy_seconds if draft_model is not None else 0.0)
            text = TextStream(target.piece, params.stop)
            out: list[int] = []  # the output's tokens (no end-of-generation token)
            spans: list[Span] = []
            emitted: list[int] = []
            from_draft: list[bool] = []
            finish: FinishReason | None = None  # set when the request ends
            stopped_by: str | None = None
            stats = tally.snapshot(t_start, 0.0, None, controller)

            while True:
                if self._cancel.is_set() or (cancel is not None and cancel.is_set()):
                    finish = "cancelled"
                    break
                # The verify always adds one token, so draft at most room - 1.
                room = params.max_tokens - (len(ctx) - n_prompt)

                # 1. Draft.
                t0 = clock()
                plan, draft = self._draft(controller, ctx, min(room - 1, max_gamma), params, rng)
                gamma = len(draft.tokens)
                t1 = clock()
                # 2. Verify: one target decode of [x_{n-1}, d_1..d_γ], scored at all γ+1 positions: each row's argmax
                #    [γ+1] when greedy, its top-k candidates [γ+1, k] when sampling.
                scores = target.decode([ctx[-1], *draft.tokens], range(gamma + 1), readout)
                t2 = clock()
                # 3. Accept.
                k, token = self._accept(ctx, draft, scores, params, rng)
                new = [*draft.tokens[:k], token]
                from_draft = [True] * k + [False]
                eog = None
                for i, t in enumerate(new):
                    if is_eog(t):  # nothing after an end-of-generation token is output
                        eog = i
                        del new[i + 1 :], from_draft[i + 1 :]
                        break
                t3 = clock()
                # 4. Roll back both models to the committed prefix.
                ctx.extend(new)
                self._roll_back(ctx)
                # 5. Update the controller's estimates.
                controller.observe(
                    plan, n_drafted=gamma, n_accepted=k, t_draft=t1 - t0, t_verify=t2 - t1, committed=new
                )

                # Emit the committed tokens' text; an end-of-generation token or a stop string ends the request.
                spans, emitted, finish, stopped_by = self._emit(new, from_draft, eog, text)
                out.extend(emitted)
                n_out = len(ctx) - n_prompt  # committed after the prompt, an end-of-generation token included
                tally.add_round(gamma, k, t1 - t0, t2 - t1, t3 - t2)
                t_llama = target.busy_seconds - busy_at_start
                if draft_model is not None:
                    t_llama += draft_model.busy_seconds
                stats = tally.snapshot(t_start, t_llama, plan, controller, generated=n_out, draft_len=gamma)
                if finish is None and n_out >= params.max_tokens:
                    finish = "length"
                    break  # the last chunk is held back to carry the text stream's tail
                yield _chunk(spans, emitted, from_draft, stats)
                if finish is not None:
                    break

            # Whatever the text stream still holds (a partial stop-string prefix, bytes of an unfinished
            # character) is output unless a stop string consumed it.
            tail = text.flush() if finish != "stop" else ""
            if finish == "length":  # the last round's chunk was held back to carry the tail
                if tail:
                    spans.append(Span(tail, False))
                yield _chunk(spans, emitted, from_draft, stats)
            elif tail:
                yield Chunk(tail, (), (), (Span(tail, False),), stats)
            stats = replace(stats, t_total=clock() - t_start)
            yield Finished(text=text.text, tokens=tuple(out), finish_reason=finish, stats=stats, stopped_by=stopped_by)
        finally:
            # Early exit (exception, generator closed): leave both caches consistent with what is committed.
            self._roll_back(ctx)

    # ----- the phases ----------------------------------------------------------------------------------------
    def _draft(
        self,
        controller: RoundController,
        ctx: list[int],
        max_len: int,
        params: SamplingParams,
        rng: Uniforms,
    ) -> tuple[Plan, Draft]:
        lookup_draft = Draft.empty()
        lookup = self._lookup
        if lookup is not None and max_len > 0:
            # Costs ~nothing, so look first, every round, and let the controller weigh what was found (it also
            # checks the proposal against what the round commits, drafted or not).
            lookup_draft = lookup.propose(ctx, max_len, params, None)
        plan = controller.plan(lookup_draft.tokens)
        gamma = min(plan.gamma, max_len)
        if plan.drafter is None or gamma <= 0:
            return plan, Draft.empty()
        if plan.drafter == "lookup":
            return plan, Draft(lookup_draft.tokens[:gamma], None)
        return plan, self.drafters[plan.drafter].propose(ctx, gamma, params, rng)

    def _emit(
        self, new: list[int], from_draft: list[bool], eog: int | None, text: TextStream
    ) -> tuple[list[Span], list[int], FinishReason | None, str | None]:
        """Text of the committed tokens, split by origin; the tokens that count as output; why to stop, if so.

        ``eog``: the index in ``new`` of an end-of-generation token (the last one), if there is one.
        """
        spans: list[Span] = []
        emitted: list[int] = []
        for i, tok in enumerate(new):
            if i == eog:
                return spans, emitted, "eos", self.target.token_text(tok)
            emitted.append(tok)
            piece = text.feed(tok)
            if piece:
                spans.append(Span(piece, from_draft[i]))
            if text.stopped_by is not None:
                return spans, emitted, "stop", text.stopped_by
        return spans, emitted, None, None

    @staticmethod
    def _accept(ctx: list[int], draft: Draft, scores: Scores, params: SamplingParams, rng: Uniforms) -> Verdict:
        # Penalties see the text so far: row i's history is the committed text plus d_1..d_{i-1}.
        counts = windows(ctx, draft.tokens, params.repeat_last_n) if params.penalized else None
        if params.greedy:
            if counts is None:
                return verify_greedy(draft.tokens, scores)  # the target's argmax per position, from llama.cpp
            return verify_greedy(draft.tokens, _Tops(Warped(scores, params, counts)))
        # p_1..p_{γ+1}, each warped when the verifier first reads it
        return verify_stochastic(draft.tokens, draft.q, Warped(scores, params, counts), rng)

    def _calibrate(self, ctx: list[int], controller: RoundController, max_gamma: int, readout: Readout) -> None:
        """Give the controller, once per engine, what a verify of b tokens and a draft step cost on this machine.

        A CPU's verify cost grows ~linearly with b while a GPU's is nearly flat (DESIGN.md): the controller needs
        the curve before it can choose γ well, and learning it from live rounds costs those rounds. The costs come
        from the cost cache when this setup was measured before, else from :meth:`_measure_costs`.
        """
        # By the readout's kind: what a decode costs barely depends on k, and a key per k would measure again (~4 s)
        # for every top-k a client sends.
        key = f"{setup_key(self.target, self.draft_model)} max_gamma={max_gamma} widths=all,2 readout={readout.kind}"
        costs = self._cost_cache.get(key) if self._cost_cache is not None else None
        if costs is None:
            costs = self._measure_costs(ctx, max_gamma, readout)
            if self._cost_cache is not None and max_gamma + 1 in costs.verify:  # only a complete measurement
                self._cost_cache.put(key, costs)
        controller.record_costs(costs.verify, costs.draft, costs.catchup)
        self._calibrated_for = readout.kind

    def _measure_costs(self, ctx: list[int], max_gamma: int, readout: Readout) -> Costs:
        """Two decodes of every verify width at the current context position (so attention length is realistic),
        rolled back; the first request's prefill time includes them (~4 s for a 1.5B model on a 2-core CPU)."""
        # Every width, because the curve is not smooth: CPU kernels work in blocks, so a 16-token decode
        # measured cheaper than a 15-token one (6.7 vs 8.5 single steps) and 8 about as cheap as 7. The faster
        # of two samples, because one delayed sample would rule a width out for good (rounds only re-measure
        # the widths they use; replays with noisy timings showed that as run-to-run swings of 10 % or more).
        # The plain step, the yardstick, gets three.
        pending = ctx[-1]
        fits = range(1, min(max_gamma + 1, self.target.n_ctx - len(ctx)) + 1)
        verify = {b: min(time_decodes(self.target, pending, b, 3 if b == 1 else 2, readout)) for b in fits}
        draft: dict[str, float] = {}
        catchup: dict[str, float] = {}
        if self.draft_model is not None and len(ctx) + 32 <= self.draft_model.n_ctx:
            draft["model"] = min(time_decodes(self.draft_model, pending, 1, 3, readout))
            # What bringing the draft model back after it sat out costs per missed token: a batched decode (the
            # second of two: the first builds the graph for that shape).
            catchup["model"] = time_decodes(self.draft_model, pending, 32, 2, None)[-1] / 32
        return Costs(verify, draft, catchup)

    def _roll_back(self, ctx: Sequence[int]) -> None:
        """Truncate every KV to the committed prefix: the target keeps ``x[0..n-1)``, drafters their share."""
        self.target.truncate(len(ctx) - 1)
        if len(self.target.kv_tokens) < len(ctx) - 1:
            # A memory that cannot drop a partial sequence (recurrent models) was cleared: rebuild the prefix.
            self.target.sync(ctx[:-1])
        for drafter in self.drafters.values():
            drafter.commit(ctx)

    def _check_fits(self, n_prompt: int, max_tokens: int) -> None:
        # The verify batch can reach γ tokens past the last committed one before the rollback.
        need = n_prompt + max_tokens + self.headroom
        limits = [("target", self.target.n_ctx)]
        if self.draft_model is not None:
            limits.append(("draft", self.draft_model.n_ctx))
        for role, n_ctx in limits:
            if need > n_ctx:
                raise ContextOverflowError(
                    f"prompt ({n_prompt} tokens) + max_tokens ({max_tokens}) + draft headroom ({self.headroom}) "
                    f"= {need} tokens exceeds the {role} context of {n_ctx}; shorten the prompt, lower "
                    f"max_tokens, or load with a larger n_ctx"
                )


class _Tally:
    """A request's running counts and times, kept mutable so a round costs additions, not a dataclass copy; each
    event carries a :class:`Stats` snapshot of them."""

    def __init__(self, prompt_tokens: int, max_gamma: int, sampling_path: str) -> None:
        self.prompt_tokens = prompt_tokens
        self.sampling_path = sampling_path
        self.prefilled = 0
        self.t_prefill = 0.0
        self.rounds = self.drafted = self.accepted = 0
        self.t_draft = self.t_verify = self.t_sample = 0.0
        self.hist = [0] * (max_gamma + 1)  # hist[k]: rounds that accepted k drafts

    def add_round(self, gamma: int, k: int, t_draft: float, t_verify: float, t_sample: float) -> None:
        self.rounds += 1
        self.drafted += gamma
        self.accepted += k
        self.hist[k] += 1
        self.t_draft += t_draft
        self.t_verify += t_verify
        self.t_sample += t_sample

    def snapshot(
        self,
        t_start: float,
        t_llama: float,
        plan: Plan | None,
        controller: RoundController,
        *,
        generated: int = 0,
        draft_len: int = 0,
    ) -> Stats:
        return Stats(
            prompt_tokens=self.prompt_tokens,
            prefilled_tokens=self.prefilled,
            generated=generated,
            rounds=self.rounds,
            drafted=self.drafted,
            accepted=self.accepted,
            t_prefill=self.t_prefill,
            t_draft=self.t_draft,
            t_verify=self.t_verify,
            t_sample=self.t_sample,
            t_total=time.perf_counter() - t_start,
            t_llama=t_llama,
            accepted_per_round=tuple(self.hist),
            drafter=(plan.drafter or "none") if plan is not None else "none",
            draft_len=draft_len,
            decision=plan.reason if plan is not None else "",
            plain_tokens_per_second=controller.plain_tokens_per_second,
            sampling_path=self.sampling_path,
        )


class _Tops(Sequence[int]):
    """The mode of each warped row, when the greedy verifier reaches it (it stops at the first mismatch)."""

    def __init__(self, rows: Warped) -> None:
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: int) -> int:  # type: ignore[override]  # rows only, no slices
        return self._rows[i].top


def _chunk(spans: list[Span], emitted: list[int], from_draft: list[bool], stats: Stats) -> Chunk:
    return Chunk(
        text=spans[0].text if len(spans) == 1 else "".join([s.text for s in spans]),
        tokens=tuple(emitted),
        from_draft=tuple(from_draft[: len(emitted)]),
        spans=tuple(spans),
        stats=stats,
    )
