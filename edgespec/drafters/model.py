"""A small model from the target's family proposes tokens, sampling from its own warped distribution q.

Sampling (rather than taking the argmax) at temperature > 0 is what makes acceptance Σ min(p, q) instead of
p(argmax q): the verifier can only be exact *and* efficient if it knows the q each token was drawn from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from edgespec.drafters.base import Draft
from edgespec.models.backend import Model
from edgespec.models.slot import Part, common_prefix
from edgespec.penalties import RowWindows, windows
from edgespec.sampling import LOGITS, Readout, SamplingParams, Scores, Uniforms, readout_for
from edgespec.warp import Dist, NeedWholeRow, sample, warp_row

if TYPE_CHECKING:
    from edgespec.constraint import Constraint


@dataclass
class Drafting:
    """A draft in progress (see :meth:`ModelDrafter.start`)."""

    context: Sequence[int]
    max_len: int
    params: SamplingParams
    rng: Uniforms
    readout: Readout
    feed: list[int]  # what the next decode appends
    tokens: list[int] = field(default_factory=list)
    qs: list[Dist] = field(default_factory=list)
    done: bool = False
    constraint: Constraint | None = None  # q_j is masked with its state after the context + d_1..d_j-1
    # q_j's penalty counts: the context plus d_1..d_j-1 (over ``tokens`` as it grows), when the request has penalties
    windows: RowWindows | None = None

    def draft(self) -> Draft:
        return Draft(self.tokens, None if self.params.greedy or not self.qs else self.qs)


class ModelDrafter:
    name = "model"

    def __init__(self, model: Model, *, p_min: float = 0.0) -> None:
        """``p_min``: stop drafting when the draft's top probability falls below it (0 = never)."""
        self.model = model
        self.p_min = p_min
        self._committed = 0  # KV positions known to equal the committed tokens

    def reset(self, context: Sequence[int]) -> None:
        # Keep what the KV shares with the new prompt, and decode nothing yet: the rest is caught up by the first
        # draft, if there is one. A controller that finds the draft model does not pay here never runs it, and then
        # its prefill would only delay the first token (on a CPU, a 0.5B draft's prefill is a third of a 1.5B
        # target's); the controller is told how far behind it starts (Controller.start_request).
        model = self.model
        model.truncate(common_prefix(model.kv_tokens, context[:-1]))
        self._committed = len(model.kv_tokens)

    def behind(self, context: Sequence[int]) -> int:
        """Committed tokens the KV lacks (what the next draft catches up first)."""
        return max(len(context) - 1 - len(self.model.kv_tokens), 0)

    def propose(
        self,
        context: Sequence[int],
        max_len: int,
        params: SamplingParams,
        rng: Uniforms,
        constraint: Constraint | None = None,
    ) -> Draft:
        if max_len <= 0:
            return Draft.empty()
        drafting = self.start(context, max_len, params, rng, constraint)
        while not drafting.done:
            _, tokens, rows, readout = self.part(drafting)
            self.take(drafting, self.model.decode(tokens, rows, readout))
        return drafting.draft()

    # A draft one step at a time, so that an engine can run the steps of several sequences' drafts in one decode.
    def start(
        self,
        context: Sequence[int],
        max_len: int,
        params: SamplingParams,
        rng: Uniforms,
        constraint: Constraint | None = None,
    ) -> Drafting:
        """A draft of up to ``max_len`` (>= 1) tokens after ``context``; its steps are :meth:`part` and :meth:`take`.
        ``constraint``: the request's, when it has one (each q is masked with it)."""
        model = self.model
        # A greedy draft needs only each step's argmax, unless the confidence cutoff needs the whole row.
        readout = LOGITS if params.greedy and self.p_min > 0 else readout_for(params, model.n_vocab)
        # Everything committed that the KV lacks: [x_{n-1}] usually, [d_γ, t] after a fully accepted round, more
        # after rounds this drafter sat out. One decode catches up and yields q_1.
        feed = list(context[len(model.kv_tokens) :])
        return Drafting(context, max_len, params, rng, readout, feed, constraint=constraint)

    def part(self, drafting: Drafting) -> Part:
        """The next decode of the draft: ``(sequence, tokens, rows, readout)``, scored at its last token."""
        return Part(self.model, drafting.feed, [len(drafting.feed) - 1], drafting.readout)

    def take(self, drafting: Drafting, scores: Scores) -> None:
        """The next drafted token, from the row that decode scored (or the end of the draft)."""
        params = drafting.params
        if drafting.readout.kind == "argmax":
            d = int(scores[0])
        else:
            # penalised with the draft's history too: the context plus the tokens drafted so far
            counts = None
            if params.penalized:
                if drafting.windows is None:
                    drafting.windows = windows(drafting.context, drafting.tokens, params.repeat_last_n)
                counts = drafting.windows[len(drafting.tokens)]
            constraint = drafting.constraint
            if constraint is None:
                q = warp_row(scores, 0, params, counts)
            else:
                mask = constraint.mask(drafting.tokens, len(drafting.tokens))
                try:
                    q = warp_row(scores, 0, params, counts, mask)
                except NeedWholeRow:  # too few allowed candidates: the row again, whole
                    constraint.rereads += 1
                    scores = self._reread(drafting.feed[-1])
                    q = warp_row(scores, 0, params, counts, mask)
            if self.p_min > 0 and _confidence(scores, q, params) < self.p_min:
                drafting.done = True
                return
            d = q.top if params.greedy else sample(q, drafting.rng)
            drafting.qs.append(q)
        drafting.tokens.append(d)
        drafting.feed = [d]
        # A draft ends at an end of generation: nothing after one is ever generated (or allowed by a constraint), so
        # a token drafted past it would only cost a draft step and a row of the verify.
        drafting.done = len(drafting.tokens) == drafting.max_len or self.model.is_eog(d)

    def _reread(self, token: int) -> np.ndarray:
        """The whole logits row after the KV's last token (``token``), decoded again."""
        model = self.model
        before = list(model.kv_tokens[:-1])
        model.truncate(len(before))
        model.sync(before)  # a memory that cannot drop a partial sequence was cleared: rebuilt
        return model.decode([token], [0], LOGITS)

    def commit(self, context: Sequence[int]) -> None:
        # Roll back: keep the longest prefix of the KV that is committed, never the pending last token.
        kv = self.model.kv_tokens
        limit = min(len(kv), len(context) - 1)
        i = min(self._committed, limit)
        while i < limit and kv[i] == context[i]:
            i += 1
        self.model.truncate(i)
        self._committed = i


def _confidence(scores: Scores, q: Dist, params: SamplingParams) -> float:
    """Top probability of the draft: of q when sampling, of the temperature-1 softmax of the whole row when greedy
    (q is one-hot then, and the readout whole logits). A heuristic for when to stop drafting: greedy ignores any
    penalties here, which can only make it draft a little longer or shorter, never change what is accepted."""
    if not params.greedy:
        return q.top_prob
    assert isinstance(scores, np.ndarray)
    top = float(scores.max())
    return 1.0 / float(np.exp(scores - top).sum()) if math.isfinite(top) else 0.0


def draft_together(model: Model, drafts: Sequence[tuple[ModelDrafter, Drafting]]) -> None:
    """Step several sequences' drafts of one draft model until every one is done, a step of each in one decode (a
    draft that ends drops out of the next). ``model``: the draft model whose sequences the drafters work on."""
    while True:
        steps = [(drafter, drafting) for drafter, drafting in drafts if not drafting.done]
        if not steps:
            return
        parts = [drafter.part(drafting) for drafter, drafting in steps]
        if len(parts) > 1:
            scores = model.decode_batch(parts)
        else:
            part = parts[0]
            scores = [part.slot.decode(part.tokens, part.rows, part.readout)]
        for (drafter, drafting), row in zip(steps, scores, strict=True):
            drafter.take(drafting, row)
