"""The engine: requests on lanes (sequences of one llama.cpp context), stepped together.

Each step runs one round of every active request (:mod:`edgespec.generation`): each plans and drafts, knowing what
the requests planned before it put into the step (the controller maximises the *batch's* tokens per second, so
speculation backs off as the batch fills where a wide decode is dear), then one target decode verifies every
request's rows, and each accepts, rolls back and updates on its own. A lone request is the same step with one lane,
so it runs the single-stream loop unchanged.

No thread of its own: every caller's thread steps for all when its own request has no event to hand out (a
leader/follower pattern), so one caller runs inline, as fast as a plain loop, and several share each decode.

An engine may hold a suffix cache (:mod:`edgespec.drafters.suffix_cache`), shared by its lanes: each request of a
scope drafts from the outputs of the earlier ones of that scope, and leaves its own there when it finishes.

One class, a little over 500 lines: admitting, stepping and retiring requests all move the same lanes and queue
under one condition variable, and the step's five phases are short functions of it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Hashable, Iterator, Sequence
from typing import NamedTuple

from edgespec.calibrate import Calibration, CostCache
from edgespec.constraint import Constraint
from edgespec.drafters.base import Drafter
from edgespec.drafters.controller import Controller
from edgespec.drafters.estimates import VerifyCost
from edgespec.drafters.lookup import LookupDrafter
from edgespec.drafters.model import ModelDrafter, draft_together
from edgespec.drafters.plan import LOOKUP, FixedController, RoundController
from edgespec.drafters.suffix_cache import SuffixCache
from edgespec.errors import ContextOverflowError, EdgespecError, InvalidParameterError
from edgespec.events import Event, Finished, Stats
from edgespec.generation import Generation, Lane, Request
from edgespec.models.slot import KVModel, Part, common_prefix
from edgespec.planner import Planner
from edgespec.prefill import Prefill
from edgespec.sampling import SamplingParams, Scores

# Long drafts only pay in copy streaks (prompt lookup), but there they do: on a CPU a 16-token verify measured
# 6.7x a single step, so a fully accepted one is 2.4x faster than plain decoding.
DEFAULT_MAX_GAMMA = 16
MAX_DRAFT_LEN = 64
# The share of a one-token decode that auto's planning may take per round, on average (see Controller.plan): on a
# CPU planning is far below it and every round is planned; on a GPU a plain plan then stands for a few rounds.
PLAN_BUDGET = 0.01
# Requests one engine serves at once: llama.cpp allows 256 sequences, but a decode's 65 rows shared by more than
# 16 leaves them a few rows each, and every sequence holds its own n_ctx of KV.
MAX_PARALLEL = 16
# After a step that finished requests, the next one waits up to this share of that step's time (at most
# HANDOVER_MAX_SECONDS) for their callers to take the results and come back with new requests, so that those join
# it: a client that sends its next request as soon as one ends (an agent, a batch job, the bench's closed loop) got
# its new request in only a step later, its lane idle meanwhile (measured: two of four lanes idle through a 2 s
# prefill step and the step after it). A caller that does not come back costs that wait once.
HANDOVER_SHARE = 0.05
HANDOVER_MAX_SECONDS = 0.05
ENGINE_SCOPE: Hashable = object()  # stream()'s cache_scope when not given: the engine's own (its cache_scope)


def parse_draft_len(value: str | int) -> int | str:
    """``"auto"``, ``"off"`` (= 0) or an integer 0..64, as typed on a command line or in a chat command."""
    text = str(value).strip().lower()
    if text in ("auto", "off"):
        return "auto" if text == "auto" else 0
    if text.isdigit() and int(text) <= MAX_DRAFT_LEN:
        return int(text)
    raise InvalidParameterError(f"draft length must be 'auto', 'off' or an integer 0..{MAX_DRAFT_LEN}, got {value!r}")


class Engine:
    """Generates with a loaded target and optional drafters, for up to ``parallel`` requests at once (the target's
    sequences; one unless it was loaded with more). Reusable across requests; safe to call from several threads.

    ``draft_len``: ``"auto"`` lets the cost-aware controller pick the drafter and γ each round (0 included);
    an integer fixes γ (the draft model if there is one, else prompt lookup; 0 = plain decoding).
    ``suffix_cache``: earlier requests' outputs to draft from, shared by the lanes; ``cache_scope``: the scope of a
    request that names none (None: such a request leaves the cache alone).
    """

    def __init__(
        self,
        target: KVModel,
        draft: KVModel | None = None,
        *,
        draft_len: int | str = "auto",
        lookup: bool = True,
        p_min: float = 0.0,
        max_gamma: int = DEFAULT_MAX_GAMMA,
        cost_cache: CostCache | None = None,
        parallel: int | None = None,
        suffix_cache: SuffixCache | None = None,
        cache_scope: Hashable | None = None,
    ) -> None:
        self.target = target
        self.draft_model = draft
        n_seq = target.n_seq
        parallel = n_seq if parallel is None else parallel
        if not 1 <= parallel <= n_seq or (draft is not None and parallel > draft.n_seq):
            raise InvalidParameterError(
                f"parallel={parallel}: the models were loaded with room for {n_seq} sequences (load with parallel=N)"
            )
        if parallel > target.max_verify_rows:
            raise InvalidParameterError(f"parallel={parallel} is more requests than one bit-exact decode can carry")
        self.parallel = parallel
        self._lanes = [self._make_lane(i, p_min, lookup) for i in range(parallel)]
        self.drafters: dict[str, Drafter] = self._lanes[0].drafters  # the drafters' names (lane 0's objects)
        self._lookup_on = lookup
        self.suffix_cache = suffix_cache
        self.cache_scope = cache_scope if suffix_cache is not None else None
        self.max_gamma = min(max_gamma, self.gamma_limit)
        self._curve: VerifyCost | None = None  # the target's decode costs: the auto controllers of all lanes share it
        self._planner = Planner(target.decode_passes, target.max_verify_rows, target.n_batch, lambda: self._curve)
        self.calibration = Calibration(target, draft, self.max_gamma, self._lanes, cost_cache)
        self._prefill = Prefill(target, self._lanes, self.calibration)
        # One condition guards the lanes, the requests and the stepper's role: a thread waits on it for its
        # request's events, for a lane, or for the step another thread is running.
        self._cond = threading.Condition()
        self._stepper: threading.Thread | None = None  # the thread running a step (or retiring a request) now
        self._active: list[Generation] = []  # requests on a lane, prefilling or in rounds
        self._waiting: deque[object] = deque()  # requests waiting for a lane, first come first served
        self._leaving: deque[Generation] = deque()  # requests retired during a step: freed when it ends
        # The hand-over after a step that finished requests (see HANDOVER_SHARE): until when the next step waits,
        # and the threads whose requests ended then, until they come back (or the wait ends).
        self._handover_until = 0.0
        self._returning: set[threading.Thread] = set()
        self.steps = 0  # decodes of the target run by steps, and their rows and sequences (for /metrics)
        self.step_rows = 0
        self.step_sequences = 0
        self.set_draft_len(draft_len)

    def _make_lane(self, index: int, p_min: float, lookup: bool) -> Lane:
        # A lone lane talks to the models themselves (sequence 0), so a single-stream engine, its fakes and its
        # replays need no slots.
        target = self.target if self.parallel == 1 else self.target.slots[index]
        draft = None
        if self.draft_model is not None:
            draft = self.draft_model if self.parallel == 1 else self.draft_model.slots[index]
        drafters: dict[str, Drafter] = {}
        if draft is not None:
            drafters["model"] = ModelDrafter(draft, p_min=p_min)
        if lookup:
            drafters["lookup"] = LookupDrafter(is_end=self.target.is_eog)
        return Lane(index, target, draft, drafters)

    # ----- configuration -------------------------------------------------------------------------------------
    def set_draft_len(self, draft_len: int | str) -> None:
        """Switch between the adaptive controller (``"auto"``) and a fixed γ (0 = plain decoding).

        A request in flight keeps the settings it started with; the change applies from the next one.
        """
        draft_len = parse_draft_len(draft_len)
        self._fixed_drafter = self._check_draft_len(draft_len)
        self.draft_len = draft_len

    def _check_draft_len(self, draft_len: int | str) -> str | None:
        """Refuse a fixed γ this engine cannot run; the drafter a fixed γ drafts with."""
        # (the suffix cache's proposals are free drafts, planned as lookup's)
        free = "lookup" in self.drafters or self.suffix_cache is not None
        name = "model" if "model" in self.drafters else ("lookup" if free else None)
        if isinstance(draft_len, int):
            if draft_len > self.gamma_limit:
                bit_exact = self.target.bit_exact
                why = " (bit-exact: llama.cpp's CPU kernels change at wider batches)" if bit_exact else ""
                raise InvalidParameterError(
                    f"draft length {draft_len} is more than this target verifies at once: at most {self.gamma_limit}"
                    + why
                )
            if draft_len and name is None:
                raise InvalidParameterError(
                    f"draft length {draft_len} needs a drafter: load a draft model or turn prompt lookup on"
                )
        return name

    def set_lookup(self, enabled: bool) -> None:
        """Prompt-lookup drafting on or off from the next request (only an engine built with lookup has it)."""
        if enabled and "lookup" not in self.drafters:
            raise InvalidParameterError("prompt lookup was turned off when the models were loaded")
        self._lookup_on = enabled

    @property
    def lookup(self) -> bool:
        """Whether prompt lookup drafts in the next request."""
        return self._lookup_on and "lookup" in self.drafters

    @property
    def gamma_limit(self) -> int:
        """The widest draft one verify takes: the target's widest batch (a bit-exact one: 7 rows) less the pending
        token."""
        return self.target.max_verify_rows - 1

    @property
    def headroom(self) -> int:
        """How far past the committed text a verify may reach: the fixed γ, or auto's largest. A request's own
        fixed γ never changes another's."""
        return self.draft_len if isinstance(self.draft_len, int) else self.max_gamma

    @property
    def active(self) -> int:
        """Requests on a lane now."""
        return sum(lane.busy for lane in self._lanes)

    @property
    def waiting(self) -> int:
        """Requests waiting for a lane."""
        return len(self._waiting)

    def cancel(self) -> None:
        """Stop every running request after its current round (safe from any thread)."""
        for generation in list(self._active):
            generation.cancelled = True

    # ----- requests ------------------------------------------------------------------------------------------
    def stream(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        *,
        cancel: threading.Event | None = None,
        draft_len: int | str | None = None,
        lookup: bool | None = None,
        cache_prompt: bool = True,
        cache_scope: Hashable | None = ENGINE_SCOPE,
    ) -> Iterator[Event]:
        """Generate after the prompt tokens; yield a :class:`Chunk` per round and a :class:`Finished` at the end.

        Bad input (an empty prompt, a request that cannot fit the context) raises here, before any work. With
        every lane taken, the request waits for one (first come, first served) when iterated; ``cancel`` ends
        the wait too. ``draft_len`` and ``lookup`` override the engine's settings for this request only.
        ``cache_prompt=False`` decodes the whole prompt even where a lane's KV already holds part of it.
        ``cache_scope``: the suffix cache's scope this request drafts from and joins (None: neither; not given: the
        engine's ``cache_scope``).
        """
        lookup = self._lookup_on if lookup is None else lookup
        request_draft_len = parse_draft_len(draft_len) if draft_len is not None else self.draft_len
        if draft_len is not None:
            self._check_draft_len(request_draft_len)
        if lookup and "lookup" not in self.drafters:
            raise InvalidParameterError("prompt lookup was turned off when the models were loaded")
        if not prompt:
            raise InvalidParameterError("the prompt is empty")
        if params.logit_bias and params.logit_bias[-1][0] >= self.target.n_vocab:  # sorted by token id
            raise InvalidParameterError(
                f"logit_bias names token {params.logit_bias[-1][0]}: the vocabulary has {self.target.n_vocab} tokens"
            )
        headroom = request_draft_len if isinstance(request_draft_len, int) else self.max_gamma
        self._check_fits(len(prompt), params.max_tokens, headroom)
        # Compiled for this vocabulary here, before the request takes a lane: a grammar the model cannot use fails
        # the call, and the first constrained request's tokenizer (~1 s to build) holds up no other request.
        constraint = (
            Constraint(params.constraint, self.target, self.target.is_eog) if params.constraint is not None else None
        )
        if cache_scope is ENGINE_SCOPE:
            cache_scope = self.cache_scope
        request = Request(
            list(prompt), params, request_draft_len, self._fixed_drafter, lookup, headroom, cache_prompt, cancel,
            constraint, cache_scope if self.suffix_cache is not None else None,
        )  # fmt: skip
        return self._serve(request)

    def _serve(self, request: Request) -> Iterator[Event]:
        generation = self._admit(request)
        if generation is None:  # cancelled while it waited for a lane
            stats = Stats(prompt_tokens=len(request.prompt))
            yield Finished(text="", tokens=(), finish_reason="cancelled", stats=stats)
            return
        try:
            events = generation.events
            while True:
                while events:
                    event = events.popleft()
                    if isinstance(event, BaseException):
                        raise event
                    yield event
                    if isinstance(event, Finished):
                        return
                # No event to hand out: run the next step for everyone, or wait for the one running.
                with self._cond:
                    while not events and (self._stepper is not None or self._handing_over()):
                        self._cond.wait(None if self._stepper is not None else self._handover_left())
                    if events:
                        continue
                    self._stepper = threading.current_thread()
                    ended_before = {id(g) for g in self._active if g.done}
                t0 = time.perf_counter()
                try:
                    self._step()
                finally:
                    self._release(time.perf_counter() - t0, ended_before)
        finally:
            self._retire(generation)

    def _release(self, step_seconds: float = 0.0, ended_before: set[int] | None = None) -> None:
        """The step is over: free the lanes of the requests retired during it, and if it ended requests, open the
        hand-over for their callers (``ended_before``: the ids of those that had ended before it)."""
        with self._cond:
            self._stepper = None
            # The requests that ended during the step give their lanes back now, before anyone steps again.
            while self._leaving:
                self._free(self._leaving.popleft())
            if any(g.done and id(g) not in (ended_before or ()) for g in self._active):
                self._returning.clear()
                self._handover_until = time.perf_counter() + min(HANDOVER_SHARE * step_seconds, HANDOVER_MAX_SECONDS)
            self._cond.notify_all()

    def _handover_left(self) -> float:
        return self._handover_until - time.perf_counter()

    def _handing_over(self) -> bool:
        """Whether the next step should wait (call holding the condition): within the hand-over, while a request
        that ended is still to be taken by its caller on another thread, or its caller has not come back, or a
        request that came is still to get a free lane."""
        if self._handover_left() <= 0:
            return False  # (threads left in _returning from an ended hand-over: cleared when the next one opens)
        me = threading.current_thread()
        return (
            any(g.done and g.owner is not me for g in self._active)
            or bool(self._returning - {me})
            or (bool(self._waiting) and not all(lane.busy for lane in self._lanes))
        )

    def _admit(self, request: Request) -> Generation | None:
        """Wait for a free lane (first come, first served) and take the one whose KV shares the longest prefix
        with the prompt; the next step prefills it."""
        me = object()
        with self._cond:
            self._returning.discard(threading.current_thread())
            self._waiting.append(me)
            try:
                while True:
                    free = [lane for lane in self._lanes if not lane.busy]
                    if free and self._waiting[0] is me:
                        break
                    if request.cancel is not None and request.cancel.is_set():
                        return None
                    if not free and all(g.owner is threading.current_thread() for g in self._active):
                        raise EdgespecError(
                            f"the engine is busy: its {self.parallel} lane(s) hold requests this thread has not "
                            "finished (iterate or close them first)"
                        )
                    self._cond.wait(0.05)  # a lane is given back with a notify; the timeout is for `cancel`
            finally:
                self._waiting.remove(me)
                self._cond.notify_all()
            lane = max(free, key=lambda ln: common_prefix(ln.target.kv_tokens, request.prompt))
            lane.busy = True
            try:
                generation = Generation(lane, request, self._controller(lane, request), self.suffix_cache)
            except BaseException:
                lane.busy = False  # the request never began: its lane is free again
                raise
            self._active.append(generation)
        return generation

    def _retire(self, generation: Generation) -> None:
        """The request ended (or its consumer left): leave its lane's caches at what it committed, free the lane.

        Never under a running step's feet: while another thread steps, the stepper frees the lane when that step
        ends. (Waiting for a moment with no step instead starved: the stepper takes its role again as soon as it
        has handed out its own events, so a finished request held its lane for dozens of steps, measured as half
        the lanes of 4 idle through a bench's second wave.)"""
        with self._cond:
            generation.done = True  # no later step plans for it; a step under way still settles it
            if self._stepper is not None:
                self._leaving.append(generation)
                return
            self._free(generation)

    def _free(self, generation: Generation) -> None:
        """Give a retired request's lane back (call holding the condition, with no step running)."""
        try:
            if generation in self._active:
                self._active.remove(generation)
            if generation.prefilled:
                generation.lane.roll_back(generation.ctx)
        finally:
            generation.lane.busy = False
            if self._handover_left() > 0:
                self._returning.add(generation.owner)
            self._cond.notify_all()

    def _controller(self, lane: Lane, request: Request) -> RoundController:
        if request.draft_len == "auto":
            if lane.auto is None:
                cache = self.suffix_cache is not None
                # The cache's proposals are planned as lookup's are (free drafts), with or without lookup itself.
                names = [*lane.drafters, *([LOOKUP] if cache and LOOKUP not in lane.drafters else [])]
                lane.auto = Controller(
                    names, max_gamma=self.max_gamma, verify_cost=self._curve, plan_budget=PLAN_BUDGET, cache=cache
                )
                self._curve = lane.auto.verify_cost
            return lane.auto
        gamma = int(request.draft_len)
        name = request.fixed_drafter if gamma else None
        key = (name, gamma)
        if key not in lane.fixed:
            lane.fixed[key] = FixedController(name, gamma)
        return lane.fixed[key]

    # ----- the step ------------------------------------------------------------------------------------------
    def _step(self) -> None:
        """One round of every request in rounds, their verifies in one target decode with the next prompt chunk of
        every request still prefilling (call as the stepper)."""
        in_rounds, prefills = self._schedule()
        live = self._planner.plan(in_rounds, prefills)
        live = self._draft(live)
        verified = self._verify(live, prefills)
        if verified is not None:
            self._settle(live, verified)

    def _schedule(self) -> tuple[list[Generation], list[tuple[Generation, Part]]]:
        """Who runs this step: the requests in rounds (those whose prompt ends in this decode among them), and the
        next prompt chunk of every request still prefilling."""
        for generation in self._active:
            if not generation.done and generation.stopping:
                generation.finish("cancelled")
        in_rounds = [g for g in self._active if not g.done and g.prefilled]
        joining = [g for g in self._active if not g.done and not g.prefilled]
        prefills, opening = self._prefill.parts(joining, bool(in_rounds))
        return in_rounds + opening, prefills

    def _draft(self, live: list[Generation]) -> list[Generation]:
        """The draft model's drafts of every request that planned one, stepped together; returns the requests still
        live (if the draft model fails, those that drafted with it fail)."""
        drafting = [g for g in live if g.drafting is not None]
        if not drafting:
            return live
        t0 = time.perf_counter()
        try:
            draft_together(self.draft_model, [(g.lane.drafters["model"], g.drafting) for g in drafting])
        except Exception as error:  # noqa: BLE001
            for g in drafting:
                g.abort(error)
            return [g for g in live if g.drafting is None]
        share = (time.perf_counter() - t0) / len(drafting)  # what each request's draft cost, the decodes shared
        for g in drafting:
            g.take_draft(share)
        return live

    def _verify(self, live: list[Generation], prefills: list[tuple[Generation, Part]]) -> Verified | None:
        """One target decode over every request's rows and the prompt chunks; the prefills it completes begin their
        rounds. None when no request has rows to settle."""
        if not live and not prefills:
            return None
        parts = [g.part() for g in live] + [part for _, part in prefills]
        t0 = time.perf_counter()
        try:
            scores = self.target.decode_batch(parts) if len(parts) > 1 else [parts[0].decode()]
        except Exception as error:  # noqa: BLE001  # the decode failed for all in it: each request gets the error
            for generation in [*live, *(g for g, _ in prefills)]:
                generation.abort(error)
            return None
        seconds = time.perf_counter() - t0
        for generation, _ in prefills:
            if generation.prefill_done:
                self._prefill.begin(generation)
        if not live:
            return None
        with_prompt = bool(prefills) or any(g.prompt_tail for g in live)
        return Verified(scores[: len(live)], seconds, len(parts) > 1, with_prompt)

    def _settle(self, live: list[Generation], verified: Verified) -> None:
        """Accept, roll back, update: each request on its own; a shared decode's cost goes to the curve once."""
        seconds = verified.seconds
        self.steps += 1
        self.step_rows += sum(g.rows for g in live)
        self.step_sequences += len(live)
        if verified.shared and not verified.with_prompt:  # a prompt chunk is no row's cost
            # The shared curve prices one forward pass: a decode llama.cpp split into several is a sample of its
            # widest pass (see VerifyCost.add_decode). A pass's width counts the throw-away tokens of lanes in a
            # gap (see microbatch.fill_gaps).
            passes = self.target.decode_passes({g.lane.index: g.rows for g in live})
            if self._curve is not None:
                self._curve.add_decode(passes, seconds)
            for generation in live:
                if generation.controller is not generation.lane.auto:
                    generation.controller.record_decode(sum(passes), seconds)
        for generation, row_scores in zip(live, verified.scores, strict=True):
            try:
                generation.settle(row_scores, seconds, verified.shared)
            except Exception as error:  # noqa: BLE001
                generation.abort(error)
        if not verified.with_prompt:
            self.calibration.check(live, seconds)

    def _check_fits(self, n_prompt: int, max_tokens: int, headroom: int | None = None) -> None:
        # The verify batch can reach γ tokens past the last committed one before the rollback.
        headroom = self.headroom if headroom is None else headroom
        need = n_prompt + max_tokens + headroom
        limits = [("target", self.target.n_ctx)]
        if self.draft_model is not None:
            limits.append(("draft", self.draft_model.n_ctx))
        for role, n_ctx in limits:
            if need > n_ctx:
                raise ContextOverflowError(
                    f"prompt ({n_prompt} tokens) + max_tokens ({max_tokens}) + draft headroom ({headroom}) "
                    f"= {need} tokens exceeds the {role} context of {n_ctx}; shorten the prompt, lower "
                    f"max_tokens, or load with a larger n_ctx"
                )


class Verified(NamedTuple):
    """What a step's target decode gave the requests in rounds."""

    scores: list[Scores]  # each request's rows, in the order of the step's live requests
    seconds: float
    shared: bool  # the decode carried other sequences (or prompt chunks) too
    with_prompt: bool  # it carried prompt tokens: its time is no verify's cost
