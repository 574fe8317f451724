"""Reference distributions for the exactness tests, written independently of the code under test.

:func:`reference_warp` restates the sampling chain (top-k → top-p → min-p on the temperature-1 softmax of the
survivors → temperature) from its definition, densely, in a few lines of numpy; it shares no code with
``edgespec.sampling``. :class:`PositionalChain` is a toy language model whose next-token logits depend on the
previous token *and* the position, so that rows of different positions differ (a verifier reading the wrong row
is caught). Its exact output distribution is plain enumeration: products of the warped transition matrices.
"""

from __future__ import annotations

import numpy as np
from stat_tools import Check, family


def reference_warp(
    logits: np.ndarray, *, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> np.ndarray:
    """The dense distribution plain decoding samples from one logits row."""
    x = np.asarray(logits, dtype=np.float64)
    n = x.shape[0]
    out = np.zeros(n)
    if temperature == 0:
        out[int(np.argmax(x))] = 1.0
        return out
    order = np.argsort(-x, kind="stable")  # best first
    if 0 < top_k < n:
        order = order[:top_k]
    w = np.exp(x[order] - x[order[0]])  # temperature-1 weights of the candidates, relative to the best
    keep = np.ones(len(order), dtype=bool)
    # top-p: the smallest prefix whose mass reaches top_p; a token stays while the mass before it is below.
    before = np.concatenate(([0.0], np.cumsum(w)[:-1])) / w.sum()
    keep &= before < top_p
    keep &= w >= min_p  # min-p: p_i >= min_p * p_max
    tempered = np.exp((x[order] - x[order[0]]) / temperature) * keep
    out[order] = tempered / tempered.sum()
    return out


class PositionalChain:
    """Next-token logits ``logits[j, prev]`` for output position ``j`` (0-based) after token ``prev``.

    ``start``: the token before the first output position (the prompt's last token).
    """

    def __init__(self, logits: np.ndarray, start: int = 0) -> None:
        # float32 values, as a decode returns them, so the reference and the code under test warp the same numbers
        self.logits = logits.astype(np.float32).astype(np.float64)  # [J, V, V]
        self.start = start

    @property
    def n_vocab(self) -> int:
        return self.logits.shape[-1]

    @staticmethod
    def random(rng: np.random.Generator, n_vocab: int, length: int, sharp: float = 2.0) -> PositionalChain:
        return PositionalChain(rng.normal(size=(length, n_vocab, n_vocab)) * sharp)

    def perturbed(self, rng: np.random.Generator, noise: float) -> PositionalChain:
        """A draft model for this chain: the same logits plus Gaussian noise (agrees often, not always)."""
        return PositionalChain(self.logits + rng.normal(size=self.logits.shape) * noise, self.start)

    def transitions(self, **warps: float) -> np.ndarray:
        """``T[j, prev, next]``: the warped next-token distributions, by :func:`reference_warp`."""
        J, V, _ = self.logits.shape
        return np.array([[reference_warp(self.logits[j, a], **warps) for a in range(V)] for j in range(J)])


def prefix_joint(T: np.ndarray, start: int, length: int) -> np.ndarray:
    """The joint distribution of the first ``length`` output tokens, ``[V] * length``."""
    joint = T[0, start]
    for j in range(1, length):
        joint = joint[..., None] * T[j][(None,) * (j - 1) + (slice(None), slice(None))]
    return joint


def output_checks(samples: np.ndarray, joint: np.ndarray) -> list[Check]:
    """The checks every exactness test runs on ``[n, L]`` sampled outputs against their exact joint ``[V] * L``:
    each position's marginal, each consecutive pair, and the first three tokens together (Bonferroni-corrected as
    one family)."""
    n, length = samples.shape
    V = joint.shape[0]
    axes = tuple(range(length))

    def observed(*positions: int) -> np.ndarray:
        counts = np.zeros((V,) * len(positions))
        np.add.at(counts, tuple(samples[:, j] for j in positions), 1)
        return counts

    def exact(*positions: int) -> np.ndarray:
        return joint.sum(axis=tuple(a for a in axes if a not in positions))

    cells: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for j in range(length):
        cells[f"x{j + 1}"] = (observed(j), exact(j))
    for j in range(length - 1):
        cells[f"(x{j + 1},x{j + 2})"] = (observed(j, j + 1), exact(j, j + 1))
    if length >= 3:
        cells["(x1,x2,x3)"] = (observed(0, 1, 2), exact(0, 1, 2))
    return family(cells)


def sparse_output_checks(samples: list[tuple[int, ...]], exact: dict[tuple[int, ...], float]) -> list[Check]:
    """:func:`output_checks` for a real vocabulary: outputs as tuples, the exact joint as ``{sequence: probability}``
    over its support (any sequence outside it is an impossible outcome)."""
    length = len(samples[0])

    def cells(*positions: int) -> tuple[np.ndarray, np.ndarray]:
        observed: dict[tuple[int, ...], int] = {}
        for s in samples:
            key = tuple(s[j] for j in positions)
            observed[key] = observed.get(key, 0) + 1
        expected: dict[tuple[int, ...], float] = {}
        for seq, p in exact.items():
            key = tuple(seq[j] for j in positions)
            expected[key] = expected.get(key, 0.0) + p
        keys = sorted(set(observed) | set(expected))
        return np.array([observed.get(k, 0) for k in keys]), np.array([expected.get(k, 0.0) for k in keys])

    checks = {f"x{j + 1}": cells(j) for j in range(length)}
    checks.update({f"(x{j + 1},x{j + 2})": cells(j, j + 1) for j in range(length - 1)})
    if length >= 3:
        checks["(x1,x2,x3)"] = cells(0, 1, 2)
    return family(checks)


def reference_penalize(
    logits: np.ndarray,
    history: list[int],
    *,
    repeat_penalty: float = 1.0,
    repeat_last_n: int = 64,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    logit_bias: dict[int, float] | None = None,
) -> np.ndarray:
    """Logit bias, then llama.cpp's repeat penalty and OpenAI's frequency and presence penalties over the last
    ``repeat_last_n`` tokens of ``history``, one token at a time from their definitions."""
    x = np.array(logits, dtype=np.float64)
    for t, b in (logit_bias or {}).items():
        x[t] += b
    recent = history[max(0, len(history) - repeat_last_n) :] if repeat_last_n > 0 else []
    for t in set(recent):
        c = recent.count(t)
        x[t] = x[t] / repeat_penalty if x[t] > 0 else x[t] * repeat_penalty
        x[t] -= c * frequency_penalty + presence_penalty
    return x
