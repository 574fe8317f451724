"""One request's rounds: draft → verify → accept → roll back → update, split at the verify.

State between rounds: the committed tokens ``x[0..n)``. The target's KV holds ``x[0..n-1)``; the last committed
token ``x[n-1]`` is *pending* and opens the next verify batch. Plain decoding is the same round with γ = 0, so the
baseline, the fallback and the speculative path share every line.

The round is cut in two around the target's decode, because that decode is shared: the engine asks every active
request for its verify rows (:meth:`Generation.propose`, then :meth:`Generation.part`), runs one decode over all of
them, and hands each its scores back (:meth:`Generation.settle`). A lone request is the same with one part.

One module of ~550 lines because it is one object's life: a request's rounds, its prefill and its events share the
committed tokens, the lane and the controller, and apart each half would reach into the other's state.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from edgespec.constraint import Constraint, Mask
from edgespec.drafters.base import FORCED, Draft, Drafter
from edgespec.drafters.model import Drafting, ModelDrafter
from edgespec.drafters.plan import CACHE, LOOKUP, NOTHING, Free, Load, Plan, RoundController
from edgespec.drafters.suffix_cache import SuffixCache
from edgespec.events import Chunk, Event, Finished, FinishReason, Span, Stats, TokenLogprob
from edgespec.logprobs import row_logprob, token_logprob
from edgespec.models.slot import KVSlot, Part, common_prefix
from edgespec.penalties import windows
from edgespec.sampling import LOGITS, Readout, SamplingParams, Scores, Uniforms, verify_readout
from edgespec.tally import Tally
from edgespec.text import TextStream
from edgespec.verify import Verdict, verify_greedy, verify_stochastic
from edgespec.warp import Warped

PROMPT_ROWS = 64  # prompt tokens a scored prefill decodes at once (each is a row: llama.cpp's buffers hold 65)
# What a finished request leaves in the suffix cache: its output led by this many of its prompt's last tokens (the
# chat template's assistant header and the question's last words), so that the next such request's first tokens
# have a match too.
CACHE_LEAD = 8
# The cache's proposal ends before a token fewer than this share of the earlier outputs continued with: where they
# went different ways, the majority's token is mostly wrong (docs/design.md), and so is what follows it.
CACHE_MIN_PROB = 0.6


@dataclass(frozen=True)
class Request:
    """A request as the engine took it: what to generate after which prompt, and how to draft for it."""

    prompt: list[int]
    params: SamplingParams
    draft_len: int | str  # a fixed γ (0: plain decoding) or "auto"
    fixed_drafter: str | None  # what a fixed γ drafts with
    lookup: bool  # prompt lookup drafts (and auto may choose it)
    headroom: int  # the most tokens a verify may reach past the committed text: the fixed γ, or auto's largest
    cache_prompt: bool = True  # keep the prefix of the prompt the lane's KV already holds (llama-server's name)
    cancel: threading.Event | None = None
    constraint: Constraint | None = None  # compiled for the target's vocabulary
    # The suffix cache's scope: what this request's output joins, and the only earlier outputs it drafts from (None:
    # it neither drafts from the cache nor joins it).
    cache_scope: Hashable | None = None


@dataclass(frozen=True)
class Proposal:
    """What a round could draft without drafting, the input to its plan."""

    t0: float  # when the round's planning began (its drafting time counts from here)
    room: int  # tokens the request may still generate
    max_len: int  # the longest draft this round: room - 1, max γ and the decode's rows
    lookup: list[int]  # the free proposal, prompt lookup's or the suffix cache's (empty: none, or both off)
    agreement: int  # what its source knows of where it came from (see Free)
    from_prompt: bool
    forced: list[int]  # the tokens the constraint forces next (at most max_len)
    source: str = LOOKUP  # where the free proposal came from: LOOKUP or CACHE


@dataclass
class Lane:
    """One sequence of the engine's models: a target slot, the draft model's slot, the drafters and controllers that
    work on them. Its KV outlives a request, so that the next request sharing a prefix with it reuses the cells."""

    index: int
    target: KVSlot  # a Model (a lone lane) or one of its Slots
    draft: KVSlot | None
    drafters: dict[str, Drafter]
    auto: RoundController | None = None  # the adaptive controller, created on first use; kept across requests
    fixed: dict[tuple[str | None, int], RoundController] = field(default_factory=dict)
    calibrated_for: str | None = None  # the readout kind whose costs the auto controller holds
    busy: bool = False

    def roll_back(self, ctx: Sequence[int]) -> None:
        """Truncate every KV to the committed prefix: the target keeps ``x[0..n-1)``, drafters their share."""
        self.target.truncate(len(ctx) - 1)
        if len(self.target.kv_tokens) < len(ctx) - 1:
            # A memory that cannot drop a partial sequence (recurrent models) was cleared: rebuild the prefix.
            self.target.sync(ctx[:-1])
        for drafter in self.drafters.values():
            drafter.commit(ctx)


class Generation:
    """A request on a lane, between its admission and its :class:`Finished` event. Its events queue up in
    :attr:`events` (an exception ends them), for the thread that owns the request to yield."""

    def __init__(
        self, lane: Lane, request: Request, controller: RoundController, cache: SuffixCache | None = None
    ) -> None:
        self.lane = lane
        # Whether the prefix of the prompt that the lane's KV already holds is kept (llama-server's cache_prompt):
        # off, the whole prompt is decoded again, as for a client that asked for no caching (and a benchmark whose
        # time to first token must include every prompt's prefill).
        self.cache_prompt = request.cache_prompt
        self.params = params = request.params
        self.controller = controller
        self.max_gamma = request.headroom  # a fixed γ drafts exactly that far; auto up to max_gamma
        self.lookup = lane.drafters.get("lookup") if request.lookup else None
        self.cache = cache if request.cache_scope is not None else None  # the engine's, shared by its lanes
        self.scope = request.cache_scope
        self.cancel = request.cancel
        self.cancelled = False  # set by the engine (Engine.cancel)
        self.owner = threading.current_thread()  # the thread that iterates its events
        target = lane.target
        self._is_eog, self._token_text = target.is_eog, target.token_text
        self.ctx = list(request.prompt)
        self.n_prompt = len(request.prompt)
        self.rng: Uniforms = params.rng()
        # The output's constraint, if any: its state after the committed output, forked along each draft.
        constraint = request.constraint
        if constraint is None and params.constraint is not None:
            constraint = Constraint(params.constraint, target, target.is_eog)
        self.constraint = constraint
        # What the verify reads back per row: the argmax or the top-k candidates, selected inside llama.cpp.
        self.readout: Readout = verify_readout(params, target.n_vocab)
        self.events: deque[Event | BaseException] = deque()
        self.done = False
        self.text = TextStream(target.piece, params.stop)
        self.out: list[int] = []  # the output's tokens (no end-of-generation token)
        self.logprobs: list[TokenLogprob] = []  # theirs, when asked for
        # the prompt's, when asked for: its first token has none
        self.prompt_logprobs: list[TokenLogprob | None] = [None] if params.prompt_logprobs is not None else []
        self.clock = time.perf_counter
        self.t_start = self.clock()
        self.tally = Tally(self.n_prompt, self.max_gamma, target.readout_path(self.readout))
        self.stats = self.tally.snapshot(self.t_start, 0.0, None, controller)
        self._models = [m for m in (lane.target, lane.draft) if m is not None]
        self._busy_at_start = 0.0
        self._prefill_start: int | None = None  # where the prompt's prefill began (the prefix kept before it)
        self.prefilled = False  # the prompt is in every KV: the rounds have begun
        self.prompt_tail: list[int] = []  # the prompt's rest, decoded before the first verify (open_with_prompt_tail)
        # this round's
        self.plan: Plan | None = None
        self.draft = Draft.empty()
        self.drafting: Drafting | None = None  # a draft model's draft the engine steps with the others'
        self.n_forced = 0  # of this round's draft, the leading tokens its constraint forced
        self.t_draft = 0.0
        # this round's free proposal (None: lookup and the cache off), where it came from, and the most tokens the
        # request may draft (its room)
        self.lookup_proposal: list[int] | None = None
        self.source = LOOKUP
        self.max_draft = 0

    # ----- before the first round ----------------------------------------------------------------------------
    def prefill_part(self, limit: int) -> Part | None:
        """The next chunk (at most ``limit`` tokens) of the KV of everything but the pending last token; None when
        the KV holds it all. A prefix the lane's KV already shares with the prompt is kept, not recomputed."""
        target = self.lane.target
        want = self.ctx[:-1]
        if self._prefill_start is None:
            # Scoring the prompt needs every position's row: nothing is kept then.
            keep = self.cache_prompt and not self.scores_prompt
            target.truncate(common_prefix(target.kv_tokens, want) if keep else 0)
            if not self.cache_prompt and self.lane.draft is not None:
                self.lane.draft.truncate(0)  # the draft model, too, catches up on the whole prompt
            self._prefill_start = len(target.kv_tokens)
            self.tally.prefilled = len(want) - self._prefill_start
        have = len(target.kv_tokens)
        if have >= len(want):
            return None
        if self.scores_prompt:  # row j of the chunk is the distribution of the token after it
            chunk = want[have : have + min(limit, PROMPT_ROWS)]
            return Part(target, chunk, range(len(chunk)), LOGITS)
        return Part(target, want[have : have + limit], (), LOGITS)

    @property
    def scores_prompt(self) -> bool:
        return self.params.prompt_logprobs is not None

    def take_prompt_rows(self, start: int, rows: np.ndarray) -> None:
        """The rows of a scored prefill chunk that began at prompt position ``start``: row j is the target's
        distribution of prompt token ``start + j + 1``."""
        top = self.params.prompt_logprobs or 0
        for j in range(len(rows)):
            self.prompt_logprobs.append(token_logprob(rows[j], self.ctx[start + j + 1], top))

    @property
    def prefill_begun(self) -> bool:
        return self._prefill_start is not None

    @property
    def prefill_done(self) -> bool:
        return len(self.lane.target.kv_tokens) >= len(self.ctx) - 1

    def begin_rounds(self) -> None:
        """The prompt is in the target's KV: the drafters start on it, and the rounds begin."""
        self._start_drafters()
        self.prefilled = True

    def open_with_prompt_tail(self, tail: list[int]) -> None:
        """The rounds begin with the decode that prefills ``tail``, the rest of the prompt before its last token:
        the first round's verify block follows it in the same decode, so that the first token comes with the end
        of the prefill instead of a step later (under load, a step that prefills others' prompts too)."""
        self._start_drafters()
        self.prompt_tail = tail

    def _start_drafters(self) -> None:
        """Every drafter is reset to the prompt (a draft model catches up when it first drafts, and the controller
        knows how far it has to)."""
        behind = {}
        for name, drafter in self.lane.drafters.items():
            drafter.reset(self.ctx)
            if isinstance(drafter, ModelDrafter):
                behind[name] = drafter.behind(self.ctx)
        self.controller.start_request(behind)

    def started(self) -> None:
        """The prefill (and a calibration, if any) is done: the rounds begin."""
        self.tally.t_prefill = self.clock() - self.t_start
        self._busy_at_start = sum(m.busy_seconds for m in self._models)
        # What a request that ends before any round (max_tokens 0, a cancel) reports.
        self.stats = self.tally.snapshot(self.t_start, 0.0, None, self.controller)

    @property
    def stopping(self) -> bool:
        return self.cancelled or (self.cancel is not None and self.cancel.is_set())

    # ----- one round -------------------------------------------------------------------------------------
    def proposal(self, load: Load) -> Proposal:
        """1. What this round could draft for free, given the others' ``load``: the likelier of lookup's proposal and
        the suffix cache's, and the tokens the constraint forces, within the request's room and the decode's."""
        t0 = self.clock()
        # The verify always adds one token, so draft at most room - 1.
        room = self.params.max_tokens - (len(self.ctx) - self.n_prompt)
        max_len = min(room - 1, self.max_gamma, load.room - 1)
        constraint = self.constraint
        # Both cost ~nothing, so look first, every round, and let the controller weigh what was found (it also checks
        # each proposal against what the round commits, drafted or not).
        found = [f for f in (self._looked_up(max_len), self._cached(max_len)) if f is not None]
        free = self.controller.offer(found) if found else NOTHING
        self.lookup_proposal = list(free.tokens) if found else None
        self.source = free.source
        self.max_draft = max(min(room - 1, self.max_gamma), 0)
        return Proposal(
            t0=t0,
            room=room,
            max_len=max_len,
            lookup=list(free.tokens),
            agreement=free.agreement,
            from_prompt=free.from_prompt,
            forced=constraint.forced(max_len) if constraint is not None and max_len > 0 else [],
            source=free.source,
        )

    def _looked_up(self, max_len: int) -> Free | None:
        """Prompt lookup's proposal from the request's own text (None: lookup is off for it)."""
        lookup = self.lookup
        if lookup is None:
            return None
        tokens = self._allowed(lookup.propose(self.ctx, max_len, self.params, None).tokens) if max_len > 0 else []
        return Free(tokens, LOOKUP, lookup.last_agreement, lookup.last_from_prompt) if tokens else NOTHING

    def _cached(self, max_len: int) -> Free | None:
        """The suffix cache's proposal from earlier outputs of the request's scope (None: no cache for it), ending
        with the first end-of-generation token it copies, as lookup's does."""
        if self.cache is None:
            return None
        if max_len <= 0:
            return Free((), CACHE)
        found = self.cache.propose(self.scope, self.ctx, max_len, min_prob=CACHE_MIN_PROB)
        tokens = list(found.tokens)
        for i, token in enumerate(tokens):
            if self._is_eog(token):
                del tokens[i + 1 :]
                break
        tokens = self._allowed(tokens)
        if not tokens:
            return Free((), CACHE)
        # Its anchor: the match length, a bucket higher where earlier replies took the first token more than once.
        return Free(tokens, CACHE, found.match_len * (2 if found.support[0] > 1 else 1))

    def _allowed(self, tokens: Sequence[int]) -> list[int]:
        """``tokens`` up to the first the constraint forbids: that one would be rejected for certain."""
        constraint = self.constraint
        if constraint is None:
            return list(tokens)
        return list(tokens[: constraint.valid_prefix(list(tokens))])

    def start_draft(self, proposal: Proposal, plan: Plan, forced: list[int], defer_model: bool = False) -> None:
        """1. Draft as planned (``forced``: the draft of a plan of forced tokens). ``defer_model``: a draft model's
        draft is only started (:attr:`drafting`), for the engine to step with the others'."""
        params, constraint = self.params, self.constraint
        gamma = min(plan.gamma, proposal.max_len)
        self.drafting = None
        self.n_forced = common_prefix(forced, proposal.forced) if plan.drafter == FORCED else 0
        if plan.drafter is None or gamma <= 0:
            draft = Draft.empty()
        elif plan.drafter == FORCED:
            draft = Draft(forced, None)
        elif plan.drafter == "lookup":
            draft = Draft(proposal.lookup[:gamma], None)
        elif defer_model and plan.drafter == "model":
            draft = Draft.empty()
            self.drafting = self.lane.drafters["model"].start(self.ctx, gamma, params, self.rng, constraint)
        elif plan.drafter == "model":
            draft = self.lane.drafters["model"].propose(self.ctx, gamma, params, self.rng, constraint)
        else:
            draft = self.lane.drafters[plan.drafter].propose(self.ctx, gamma, params, self.rng)
        self.plan, self.draft = plan, draft
        self.t_draft = self.clock() - proposal.t0

    def replan(self, plan: Plan, draft: Draft) -> None:
        """The planner's plan for the whole batch replaces this request's own (lockstep)."""
        self.plan, self.draft = plan, draft

    def take_draft(self, seconds: float) -> None:
        """The draft model's draft, stepped with the others' (:func:`~edgespec.drafters.model.draft_together`), is
        done: it is this round's draft, and ``seconds`` its share of the draft model's decodes."""
        assert self.drafting is not None
        self.draft = self.drafting.draft()
        self.drafting = None
        self.t_draft += seconds

    def abort(self, error: BaseException) -> None:
        """This request failed: its lane's caches back to what it committed (a request still prefilling has
        committed nothing there: its KV holds what its decodes put in), and the error is its last event."""
        if self.prefilled:
            self.lane.roll_back(self.ctx)
        self.fail(error)

    @property
    def planned_rows(self) -> int:
        """Rows this round's verify will add: its drafted tokens (or those its draft model was asked for) + 1."""
        return (self.drafting.max_len if self.drafting is not None else len(self.draft.tokens)) + 1

    @property
    def rows(self) -> int:
        """Rows this round's verify adds to the target's decode."""
        return len(self.draft.tokens) + 1

    def part(self) -> Part:
        """2. Verify: ``[x_{n-1}, d_1..d_γ]`` on this lane's sequence, scored at all γ+1 positions: each row's argmax
        when greedy, its top-k candidates when sampling (in the first round, after the prompt's tail, if any)."""
        tail = self.prompt_tail
        tokens = [*tail, self.ctx[-1], *self.draft.tokens]
        return Part(self.lane.target, tokens, range(len(tail), len(tokens)), self.readout)

    def settle(self, scores: Scores, t_verify: float, shared: bool) -> None:
        """3.-5. Accept, roll back, update; queue the round's events. ``shared``: the decode carried other
        sequences too (its cost is then recorded once, by the engine)."""
        opening = not self.prefilled  # the decode prefilled the prompt's tail as well: the prefill ends here
        if opening:
            self.prompt_tail = []
            self.prefilled = True
            self.started()
            # The decode's time is the prefill's (t_prefill), not a verify of these rows: neither the stats nor the
            # controller's costs take it as one.
            shared, t_verify = True, 0.0
        t2 = self.clock()
        draft, plan, ctx, params = self.draft, self.plan, self.ctx, self.params
        assert plan is not None
        gamma = len(draft.tokens)
        # 3. Accept.
        constraint = self.constraint
        if constraint is None:
            k, token = accept(ctx, draft, scores, params, self.rng)
        else:
            k, token = accept(
                ctx, draft, scores, params, self.rng, lambda i: constraint.mask(draft.tokens, i), self._reread
            )
            self.tally.rereads = constraint.rereads  # the draft model's and the verify's
        new = [*draft.tokens[:k], token]
        from_draft = [True] * k + [False]
        eog = None
        for i, t in enumerate(new):
            if self._is_eog(t):  # nothing after an end-of-generation token is output
                eog = i
                del new[i + 1 :], from_draft[i + 1 :]
                break
        if constraint is not None:
            constraint.commit(new)
            self.tally.t_constraint = constraint.seconds
        t3 = self.clock()
        # 4. Roll back both models to the committed prefix.
        ctx.extend(new)
        self.lane.roll_back(ctx)
        # 5. Update the controller's estimates.
        self.controller.observe(
            plan,
            n_drafted=gamma,
            n_accepted=k,
            t_draft=self.t_draft,
            t_verify=t_verify,
            committed=new,
            record_verify=not shared,
        )

        # Emit the committed tokens' text; an end-of-generation token or a stop string ends the request.
        spans, emitted, finish, stopped_by = self._emit(new, from_draft, eog)
        self.out.extend(emitted)
        logprobs: tuple[TokenLogprob, ...] = ()
        if params.logprobs is not None:  # row i of the verify is the target's distribution of new[i]
            logprobs = tuple(row_logprob(scores, i, t, params.logprobs) for i, t in enumerate(emitted))
            self.logprobs.extend(logprobs)
        n_out = len(ctx) - self.n_prompt  # committed after the prompt, an end-of-generation token included
        drafter = self.source if plan.drafter == LOOKUP else plan.drafter  # a free draft: lookup's or the cache's
        self.tally.add_round(gamma, k, self.t_draft, t_verify, t3 - t2, drafter)
        if plan.drafter == FORCED:
            self.tally.forced += min(k, self.n_forced)
        t_llama = sum(m.busy_seconds for m in self._models) - self._busy_at_start
        self.stats = self.tally.snapshot(
            self.t_start, t_llama, plan, self.controller, generated=n_out, draft_len=gamma, drafter=drafter
        )
        if finish is None and n_out >= params.max_tokens:
            # The last chunk carries the text stream's tail as well.
            self.finish("length", spans, emitted, from_draft, logprobs=logprobs)
            return
        self.events.append(_chunk(spans, emitted, from_draft, self.stats, logprobs))
        if finish is not None:
            self.finish(finish, stopped_by=stopped_by)

    def _reread(self, row: int) -> np.ndarray:
        """Row ``row`` of this round's verify as a whole logits row, decoded again: its candidates held too few
        tokens the constraint allows. The KV keeps what came before it; the roll-back restores the rest."""
        target = self.lane.target
        tokens = [self.ctx[-1], *self.draft.tokens]
        before = [*self.ctx[:-1], *tokens[:row]]  # what the row's token is decoded after
        target.truncate(min(len(target.kv_tokens), len(before)))
        target.sync(before)  # an earlier reread left less; a memory that cannot drop a part was cleared
        self.constraint.rereads += 1
        return target.decode([tokens[row]], [0], LOGITS)[0]

    def finish(
        self,
        finish: FinishReason,
        spans: list[Span] | None = None,
        emitted: list[int] | None = None,
        from_draft: list[bool] | None = None,
        stopped_by: str | None = None,
        logprobs: tuple[TokenLogprob, ...] = (),
    ) -> None:
        """Queue the last events: whatever the text stream still holds (a partial stop-string prefix, bytes of an
        unfinished character) is output unless a stop string consumed it."""
        tail = self.text.flush() if finish != "stop" else ""
        if spans is not None:  # the held-back last round ("length")
            if tail:
                spans.append(Span(tail, False))
            self.events.append(_chunk(spans, emitted or [], from_draft or [], self.stats, logprobs))
        elif tail:
            self.events.append(Chunk(tail, (), (), (Span(tail, False),), self.stats))
        stats = replace(self.stats, t_total=self.clock() - self.t_start)
        self._remember()
        self.events.append(
            Finished(
                text=self.text.text, tokens=tuple(self.out), finish_reason=finish, stats=stats, stopped_by=stopped_by,
                logprobs=tuple(self.logprobs), prompt_logprobs=tuple(self.prompt_logprobs),
            )
        )
        self.done = True

    def _remember(self) -> None:
        """Leave the output, led by the prompt's last tokens, in the suffix cache for later requests of the scope."""
        if self.cache is not None:
            self.cache.add(self.scope, self.ctx[max(self.n_prompt - CACHE_LEAD, 0) :])

    def fail(self, error: BaseException) -> None:
        self.events.append(error)
        self.done = True

    def _emit(
        self, new: list[int], from_draft: list[bool], eog: int | None
    ) -> tuple[list[Span], list[int], FinishReason | None, str | None]:
        """Text of the committed tokens, split by origin; the tokens that count as output; why to stop, if so.

        ``eog``: the index in ``new`` of an end-of-generation token (the last one), if there is one.
        """
        spans: list[Span] = []
        emitted: list[int] = []
        text = self.text
        for i, tok in enumerate(new):
            if i == eog:
                return spans, emitted, "eos", self._token_text(tok)
            emitted.append(tok)
            piece = text.feed(tok)
            if piece:
                spans.append(Span(piece, from_draft[i]))
            if text.stopped_by is not None:
                return spans, emitted, "stop", text.stopped_by
        return spans, emitted, None, None


def accept(
    ctx: list[int],
    draft: Draft,
    scores: Scores,
    params: SamplingParams,
    rng: Uniforms,
    masks: Callable[[int], Mask] | None = None,
    reread: Callable[[int], np.ndarray] | None = None,
) -> Verdict:
    """How many drafted tokens the target accepts, and the token it adds after them. ``masks``: row i's constraint
    mask (the state after ``d_1..d_i-1``), when the request has a constraint; ``reread``: a row again, whole."""
    # Penalties see the text so far: row i's history is the committed text plus d_1..d_{i-1}.
    counts = windows(ctx, draft.tokens, params.repeat_last_n) if params.penalized else None
    if params.greedy:
        if counts is None and masks is None and isinstance(scores, list):
            return verify_greedy(draft.tokens, scores)  # the target's argmax per position, from llama.cpp
        return verify_greedy(draft.tokens, _Tops(Warped(scores, params, counts, masks, reread)))
    # p_1..p_{γ+1}, each warped when the verifier first reads it
    return verify_stochastic(draft.tokens, draft.q, Warped(scores, params, counts, masks, reread), rng)


class _Tops(Sequence[int]):
    """The mode of each warped row, when the greedy verifier reaches it (it stops at the first mismatch)."""

    def __init__(self, rows: Warped) -> None:
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: int) -> int:  # type: ignore[override]  # rows only, no slices
        return self._rows[i].top


def _chunk(
    spans: list[Span], emitted: list[int], from_draft: list[bool], stats: Stats, logprobs: tuple[TokenLogprob, ...]
) -> Chunk:
    return Chunk(
        text=spans[0].text if len(spans) == 1 else "".join([s.text for s in spans]),
        tokens=tuple(emitted),
        from_draft=tuple(from_draft[: len(emitted)]),
        spans=tuple(spans),
        stats=stats,
        logprobs=logprobs,
    )
