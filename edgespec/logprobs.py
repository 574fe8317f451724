"""Log-probabilities of committed tokens: the target's raw softmax at each position, from its verify rows.

Raw means the logits as the model computed them, before penalties, bias, temperature and truncation: what OpenAI's
``logprobs`` and llama-server's (``post_sampling_probs: false``) report, and what log-likelihood evaluation needs.
They need the whole row (the normaliser sums over the vocabulary), so a request that asks for them reads whole rows.
"""

from __future__ import annotations

import numpy as np

from edgespec.events import TokenLogprob

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs


def token_logprob(row: np.ndarray, token: int, top: int) -> TokenLogprob:
    """``token``'s log-probability under the softmax of the logits ``row``, with the ``top`` most likely tokens."""
    shift = row.max()
    # The exponentials in float32 (each good to 1e-7; in float64 they cost 7x as much: 2 ms for a 150k-token row on
    # a 2-core CPU), summed in float64 so that the sum of 150k of them keeps those digits.
    log_norm = float(shift) + float(np.log(np.exp(row - shift).sum(dtype=np.float64)))
    best: tuple[tuple[int, float], ...] = ()
    if top > 0:
        ids = np.argpartition(row, -top)[-top:]
        ids = ids[np.argsort(-row[ids], kind="stable")]
        best = tuple((int(i), float(row[i]) - log_norm) for i in ids)
    return TokenLogprob(int(token), float(row[token]) - log_norm, best)
