"""Log-probabilities of committed tokens: the target's raw softmax at each position, from its verify rows.

Raw means the logits as the model computed them, before penalties, bias, temperature and truncation: what OpenAI's
``logprobs`` and llama-server's (``post_sampling_probs: false``) report, and what log-likelihood evaluation needs.
The normaliser sums over the whole row: a verify's top-k readout brings it along, computed inside llama.cpp's graph
(``Readout.log_norm``), so the committed token's and the alternatives' logits come from the candidates it reads
anyway; rows read whole (a prompt's, a constrained request's) are summed here.
"""

from __future__ import annotations

import numpy as np

from edgespec.events import TokenLogprob
from edgespec.sampling import Candidates, Scores

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


def candidate_logprob(ids: list[int], logits: list[float], log_z: float, token: int, top: int) -> TokenLogprob:
    """:func:`token_logprob` from a row's top-k candidates (raw logits) and its log normaliser ``log_z``.

    ``token`` is among them whenever it was sampled from them (the verifier's p keeps only candidates), and the
    ``top`` best are when the readout kept at least ``top`` (:func:`~edgespec.sampling.verify_readout`)."""
    try:
        at = ids.index(token)
    except ValueError:
        raise ValueError(f"token {token} is not among the row's {len(ids)} candidates") from None
    best: tuple[tuple[int, float], ...] = ()
    if top > 0:
        order = sorted(range(len(ids)), key=logits.__getitem__, reverse=True)[:top]
        best = tuple((ids[j], logits[j] - log_z) for j in order)
    return TokenLogprob(int(token), logits[at] - log_z, best)


def row_logprob(scores: Scores, row: int, token: int, top: int) -> TokenLogprob:
    """``token``'s log-probability at row ``row`` of a verify's scores: whole rows or candidates with their
    normalisers."""
    if isinstance(scores, Candidates):
        if scores.log_z is None:
            raise ValueError("log-probabilities need the readout's log-normaliser (Readout.log_norm)")
        ids, logits = scores.ids[row], scores.logits[row]
        if isinstance(logits, np.ndarray):
            ids, logits = ids.tolist(), logits.tolist()
        return candidate_logprob(ids, logits, scores.log_z[row], token, top)
    assert isinstance(scores, np.ndarray)
    return token_logprob(scores[row], token, top)
