"""A small model from the target's family proposes tokens, sampling from its own warped distribution q.

Sampling (rather than taking the argmax) at temperature > 0 is what makes acceptance Σ min(p, q) instead of
p(argmax q): the verifier can only be exact *and* efficient if it knows the q each token was drawn from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from edgespec.drafters.base import Draft
from edgespec.models.backend import Model
from edgespec.penalties import window
from edgespec.sampling import LOGITS, Dist, SamplingParams, Scores, Uniforms, readout_for, sample, warp_row


class ModelDrafter:
    name = "model"

    def __init__(self, model: Model, *, p_min: float = 0.0) -> None:
        """``p_min``: stop drafting when the draft's top probability falls below it (0 = never)."""
        self.model = model
        self.p_min = p_min
        self._committed = 0  # KV positions known to equal the committed tokens

    def reset(self, context: Sequence[int]) -> None:
        # Prefill now (the engine counts it as prompt time) and keep a shared prefix from the last request.
        self.model.sync(context[:-1])
        self._committed = len(self.model.kv_tokens)

    def propose(
        self, context: Sequence[int], max_len: int, params: SamplingParams, rng: Uniforms
    ) -> Draft:
        if max_len <= 0:
            return Draft.empty()
        model = self.model
        # A greedy draft needs only each step's argmax, unless the confidence cutoff needs the whole row.
        readout = LOGITS if params.greedy and self.p_min > 0 else readout_for(params, model.n_vocab)
        # Everything committed that the KV lacks: [x_{n-1}] usually, [d_γ, t] after a fully accepted round, more
        # after rounds this drafter sat out. One decode catches up and yields q_1.
        pending = context[len(model.kv_tokens) :]
        scores = model.decode(pending, [len(pending) - 1], readout)
        tokens: list[int] = []
        qs: list[Dist] = []
        while True:
            if readout.kind == "argmax":
                d = int(scores[0])
            else:
                # penalised with the draft's history too: the context plus the tokens drafted so far
                counts = window(context, tokens, params.repeat_last_n) if params.penalized else None
                q = warp_row(scores, 0, params, counts)
                if self.p_min > 0 and _confidence(scores, q, params) < self.p_min:
                    break
                d = q.top if params.greedy else sample(q, rng)
                qs.append(q)
            tokens.append(d)
            if len(tokens) == max_len:
                break
            scores = model.decode([d], [0], readout)
        return Draft(tokens, None if params.greedy or not qs else qs)

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
