"""Acceptance over a tree of candidates (edgespec.tree_verify): greedy walks by hand, bad input, and exactness.

Exactness: a toy target (:class:`~exact_reference.PositionalChain`, next-token logits by previous token and position)
is decoded by rounds of tree speculation, a fresh tree drafted from the output so far after each round, until
``depth + 1`` tokens are out; many runs. Their per-position marginals, consecutive pairs and first three tokens must
fit the exact distributions, enumerated from the logits with the reference warp (which shares no code with
edgespec's). Trees reach depth 5 with 2-3 children a node; the candidates are deterministic (the draft's best
distinct tokens), sampled (children drawn i.i.d. from the draft's q) or both under one node; the target's rows are
warped with top-k, top-p and min-p. The same checks at the same N and α must reject each biased verifier of
tests/biased_tree_verifiers.py. On a chain the tree verifier is the chain verifier: the same verdicts from the same
uniforms, and (from different ones) samples that a two-sample test cannot tell apart.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import pytest
from biased_tree_verifiers import CONTROLS
from exact_reference import PositionalChain, output_checks, prefix_joint
from stat_tools import Check, chi2_critical, worst

from edgespec.sampling import Candidates, SamplingParams
from edgespec.tree_verify import Tree, TreeVerdict, verify_tree_greedy, verify_tree_stochastic
from edgespec.verify import verify_greedy, verify_stochastic
from edgespec.warp import Dist, warp_row

pytestmark = pytest.mark.exactness

V = 5  # small enough that every cell of the first three tokens' joint gets counts
N = 4_000  # speculative runs per check; each biased verifier fails at this size by a clear margin

WARPS = {
    "plain": SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
    "top_k": SamplingParams(temperature=0.8, top_k=3, top_p=0.95, min_p=0.05),
    "top_p": SamplingParams(temperature=1.2, top_k=0, top_p=0.8, min_p=0.0),
    "min_p": SamplingParams(temperature=0.7, top_k=0, top_p=1.0, min_p=0.2),
}

TreeVerifier = Callable[[Tree, list[Dist | None] | None, list[Dist], np.random.Generator], TreeVerdict]


# ----- greedy, and bad input ---------------------------------------------------------------------------------
def test_greedy_descends_into_the_matching_sibling() -> None:
    tree = Tree([5, 7, 9, 2], [-1, -1, 1, 1])  # the root's children 5 and 7; 7's children 9 and 2
    assert verify_tree_greedy(tree, [7, 0, 2, 0, 3]) == ([1, 3], 3)  # second sibling, twice; then 2's bonus
    assert verify_tree_greedy(tree, [7, 0, 4, 0, 0]) == ([1], 4)  # neither of 7's children: the argmax after 7
    assert verify_tree_greedy(tree, [6, 0, 0, 0, 0]) == ([], 6)  # no match at the root
    assert verify_tree_greedy(Tree([4, 4], [-1, -1]), [4, 8, 9]) == ([0], 8)  # the first of equal siblings


def test_greedy_follows_a_deep_path_past_branches() -> None:
    # 0:1 ─ 1:2 ─ 3:3 ─ 5:4 ─ 6:5 (the path), with dead branches 2:9 (under 0) and 4:8 (under 1)
    tree = Tree([1, 2, 9, 3, 8, 4, 5], [-1, 0, 0, 1, 1, 3, 5])
    top = [1, 2, 3, 0, 4, 0, 5, 6]
    assert verify_tree_greedy(tree, top) == ([0, 1, 3, 5, 6], 6)
    assert verify_tree_greedy(Tree([], []), [8]) == ([], 8)  # no candidates: plain greedy decoding


def test_greedy_on_a_chain_is_the_chain_verifier() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        gamma = int(rng.integers(0, 6))
        draft, top = rng.integers(0, 3, gamma).tolist(), rng.integers(0, 3, gamma + 1).tolist()
        path, token = verify_tree_greedy(Tree.chain(draft), top)
        assert (path, token) == (list(range(len(path))), verify_greedy(draft, top).token)
        assert len(path) == verify_greedy(draft, top).n_accepted


def test_bad_trees_and_rows_are_refused() -> None:
    row = Dist([0, 1], [0.5, 0.5])
    rng = np.random.default_rng(0)
    for tree in (Tree([1, 2], [-1, 1]), Tree([1, 2], [1, -1]), Tree([1], [-2]), Tree([1, 2], [-1])):
        with pytest.raises(ValueError):
            verify_tree_greedy(tree, [0, 0, 0])
        with pytest.raises(ValueError):
            verify_tree_stochastic(tree, None, [row] * 3, rng)
    chain = Tree.chain([1, 0])
    with pytest.raises(ValueError, match="target rows"):
        verify_tree_greedy(chain, [0, 0])
    with pytest.raises(ValueError, match="target rows"):
        verify_tree_stochastic(chain, None, [row] * 2, rng)
    with pytest.raises(ValueError, match="one entry per node"):
        verify_tree_stochastic(chain, [row], [row] * 3, rng)


def test_a_rejected_candidate_is_never_the_correction() -> None:
    rng = np.random.default_rng(1)
    tree = Tree([0, 1, 0], [-1, -1, -1])  # deterministic 0 and 1 (and 0 again, which cannot be accepted twice)
    p = [Dist([0, 1, 2], [0.3, 0.3, 0.4]), *[Dist.one_hot(3)] * 3]
    for _ in range(300):
        path, token = verify_tree_stochastic(tree, None, p, rng)
        assert path in ([], [0], [1]) and (path or token == 2)


def test_on_a_chain_the_verdicts_are_the_chain_verifiers_from_the_same_uniforms() -> None:
    """The walk over a chain makes the chain verifier's comparisons and draws in its order, by construction."""
    gen = np.random.default_rng(11)
    for sampled in (True, False):
        for _ in range(300):
            gamma = int(gen.integers(0, 5))
            p = [_random_dist(gen) for _ in range(gamma + 1)]
            q = [_random_dist(gen) for _ in range(gamma)] if sampled else None
            draft = [int(gen.choice(d.ids, p=d.probs)) for d in q] if q else gen.integers(0, V, gamma).tolist()
            seed = int(gen.integers(1 << 30))
            path, token = verify_tree_stochastic(Tree.chain(draft), q, p, np.random.default_rng(seed))
            assert (len(path), token) == verify_stochastic(draft, q, p, np.random.default_rng(seed))


def _random_dist(gen: np.random.Generator) -> Dist:
    probs = gen.dirichlet(np.ones(V)) * (gen.random(V) < 0.8)  # some tokens impossible
    probs = probs if probs.sum() > 0 else np.eye(V)[0]
    return Dist(list(range(V)), (probs / probs.sum()).tolist())


# ----- exactness ---------------------------------------------------------------------------------------------
@dataclass
class Setup:
    """A target and a draft chain, their rows as edgespec warps them, and the shape of the trees drafted."""

    shape: tuple[int, ...]  # children of each node, by depth: (3, 2) is 3 under the root, 2 under each of those
    candidates: str  # "deterministic", "sampled" (i.i.d. from q) or "mixed" (the draft's best, then sampled ones)
    warp: str
    target: PositionalChain
    p_rows: list[list[Dist]]  # [position][previous token]
    q_rows: list[list[Dist]]
    draws: list[list[tuple[list[int], list[float]]]]  # q's rows as (ids, cumulative probabilities), for the drafter

    @property
    def length(self) -> int:
        return len(self.shape) + 1  # the deepest candidate and the bonus after it are output positions too


def rows_as_edgespec_warps_them(chain: PositionalChain, params: SamplingParams, shuffle: np.random.Generator):
    """Each (position, previous token) row warped by edgespec from all V candidates, as llama.cpp's in-graph
    top-k hands them back (in no particular order); its top-k, top-p and min-p cut them in Python."""
    J, _, n = chain.logits.shape
    flat = chain.logits.reshape(J * n, n).astype(np.float32)
    order = np.array([shuffle.permutation(n) for _ in range(J * n)])
    scores = Candidates(order.tolist(), np.take_along_axis(flat, order, axis=1).tolist())
    rows = [warp_row(scores, r, params) for r in range(J * n)]
    return [rows[j * n : (j + 1) * n] for j in range(J)]


def make_setup(shape: tuple[int, ...], candidates: str, warp: str) -> Setup:
    rng = np.random.default_rng(100 * len(shape) + sum(shape))
    positions = 2 * len(shape) + 1  # a round starting at the last output position drafts len(shape) past it
    target = PositionalChain.random(rng, V, positions, sharp=1.5)
    draft = target.perturbed(rng, noise=1.0)
    p_rows = rows_as_edgespec_warps_them(target, WARPS[warp], rng)
    q_rows = rows_as_edgespec_warps_them(draft, WARPS["plain"], rng)  # every token possible, as drafts go
    draws = [[(list(q.ids), list(accumulate(q.probs))) for q in row] for row in q_rows]
    return Setup(shape, candidates, warp, target, p_rows, q_rows, draws)


def draft_tree(setup: Setup, m: int, prev: int, rng: np.random.Generator):
    """A tree drafted after ``m`` output tokens ending in ``prev``, level by level (so in topological order), with
    the q of each candidate and the target's rows: ``p[0]`` at the root, ``p[i + 1]`` after node ``i``."""
    tokens: list[int] = []
    parents: list[int] = []
    q: list[Dist | None] = []
    p = [setup.p_rows[m][prev]]
    level = [(-1, prev)]
    for depth, width in enumerate(setup.shape):
        row, below = m + depth, []
        for parent, ctx in level:
            for k in range(width):
                if setup.candidates == "deterministic" or (setup.candidates == "mixed" and k == 0):
                    x, q_x = setup.q_rows[row][ctx].ids[k], None  # the draft's k-th best: distinct siblings
                else:
                    ids, cumulative = setup.draws[row][ctx]
                    x = ids[min(bisect_right(cumulative, rng.random() * cumulative[-1]), len(ids) - 1)]
                    q_x = setup.q_rows[row][ctx]
                below.append((len(tokens), x))
                tokens.append(x)
                parents.append(parent)
                q.append(q_x)
                p.append(setup.p_rows[row + 1][x])
        level = below
    return Tree(tokens, parents), (None if setup.candidates == "deterministic" else q), p


def speculate(setup: Setup, n: int, rng: np.random.Generator, verify: TreeVerifier = verify_tree_stochastic):
    """``n`` runs of tree speculation, each to ``setup.length`` output tokens; ``[n, length]`` token ids."""
    length = setup.length
    out = np.zeros((n, length), dtype=np.int64)
    for r in range(n):
        x: list[int] = []
        while len(x) < length:
            tree, q, p = draft_tree(setup, len(x), x[-1] if x else setup.target.start, rng)
            path, token = verify(tree, q, p, rng)
            x.extend(tree.tokens[i] for i in path)
            x.append(int(token))
        out[r] = x[:length]
    return out


def checks_of(samples: np.ndarray, setup: Setup) -> list[Check]:
    w = WARPS[setup.warp]
    T = setup.target.transitions(temperature=w.temperature, top_k=w.top_k, top_p=w.top_p, min_p=w.min_p)
    return output_checks(samples, prefix_joint(T, setup.target.start, setup.length))


CONFIGS = [
    pytest.param((3, 2, 1, 1, 1), "deterministic", "top_k", id="depth5-deterministic-top_k"),
    pytest.param((2, 2, 2, 1, 1), "sampled", "top_p", id="depth5-sampled-top_p"),
    pytest.param((3, 3), "sampled", "min_p", id="depth2-sampled-min_p"),
    pytest.param((3, 2, 2), "mixed", "plain", id="depth3-mixed-plain"),
    pytest.param((2, 3, 1, 1), "mixed", "top_k", id="depth4-mixed-top_k"),
]


@pytest.mark.parametrize("shape, candidates, warp", CONFIGS)
def test_every_position_has_the_targets_distribution(shape: tuple[int, ...], candidates: str, warp: str) -> None:
    setup = make_setup(shape, candidates, warp)
    rng = np.random.default_rng(7)
    checks = checks_of(speculate(setup, N, rng), setup)
    assert worst(checks).ratio <= 1, checks
    _assert_the_walk_reaches_everywhere(setup, rng)


def _assert_the_walk_reaches_everywhere(setup: Setup, rng: np.random.Generator) -> None:
    """The test has teeth only if rounds stop at every depth (the root included), later siblings are accepted, and
    some rounds accept a whole path to a leaf."""
    depths = np.zeros(len(setup.shape) + 1, dtype=int)  # rounds by the length of their accepted path
    later_siblings = 0

    def counting(tree, q, p, rng) -> TreeVerdict:
        nonlocal later_siblings
        verdict = verify_tree_stochastic(tree, q, p, rng)
        depths[len(verdict.path)] += 1
        later_siblings += any(tree.parents.index(tree.parents[i]) != i for i in verdict.path)
        return verdict

    speculate(setup, 400, rng, counting)
    assert (depths > 0).all() and later_siblings > 0, f"rounds by depth: {depths.tolist()}, {later_siblings=}"


# How far past its critical value the worst check of a biased verifier must be: a clear margin, not a near miss.
MARGIN = 2.0
# Each control meets deterministic and sampled candidates on cut rows (where it also emits tokens the warp removed,
# impossible outcomes), and mixed ones on plain rows, where every token is possible and only the frequencies tell.
CONTROL_CASES = [
    pytest.param(biased, *config.values, id=f"{biased.__name__}-{config.id}")
    for biased in CONTROLS
    for config in (CONFIGS[0], CONFIGS[2], CONFIGS[3])
]


@pytest.mark.parametrize("biased, shape, candidates, warp", CONTROL_CASES)
def test_the_checks_reject_a_biased_tree_verifier(
    biased: TreeVerifier, shape: tuple[int, ...], candidates: str, warp: str
) -> None:
    setup = make_setup(shape, candidates, warp)
    checks = checks_of(speculate(setup, N, np.random.default_rng(7), biased), setup)
    assert worst(checks).ratio > MARGIN, f"{biased.__name__} passed the exactness checks: {checks}"


# ----- a chain, against the chain verifier ---------------------------------------------------------------------
def as_tree_verifier(tree: Tree, q, p, rng) -> TreeVerdict:
    """:func:`verify_stochastic` on a chain, with a tree verifier's signature."""
    n_accepted, token = verify_stochastic(tree.tokens, q, p, rng)
    return TreeVerdict(list(range(n_accepted)), token)


def two_sample_checks(a: np.ndarray, b: np.ndarray) -> list[tuple[str, float]]:
    """Per-position marginals and the first three tokens of two equal-sized samples: χ² of homogeneity
    (``Σ (a - b)² / (a + b)`` over cells, rare ones pooled), as ratios to the Bonferroni-corrected critical value."""
    views = {f"x{j + 1}": (j,) for j in range(a.shape[1])} | {"(x1,x2,x3)": (0, 1, 2)}
    out = []
    for name, positions in views.items():
        counts = np.zeros((2,) + (V,) * len(positions))
        np.add.at(counts, (0, *(a[:, j] for j in positions)), 1)
        np.add.at(counts, (1, *(b[:, j] for j in positions)), 1)
        x, y = counts[0].ravel(), counts[1].ravel()
        big = x + y >= 10
        x, y = np.append(x[big], x[~big].sum()), np.append(y[big], y[~big].sum())
        keep = x + y > 0
        stat = float(((x[keep] - y[keep]) ** 2 / (x[keep] + y[keep])).sum())
        out.append((name, stat / chi2_critical(max(int(keep.sum()) - 1, 1), 1e-4 / len(views))))
    return out


@pytest.mark.parametrize("candidates", ["sampled", "deterministic"])
def test_on_a_chain_the_tree_verifier_has_the_chain_verifiers_distribution(candidates: str) -> None:
    setup = make_setup((1, 1, 1), candidates, "top_k")  # a chain of γ = 3
    tree_samples = speculate(setup, N, np.random.default_rng(21))
    chain_samples = speculate(setup, N, np.random.default_rng(22), as_tree_verifier)
    ratios = two_sample_checks(tree_samples, chain_samples)
    assert max(r for _, r in ratios) <= 1, ratios
    assert worst(checks_of(tree_samples, setup)).ratio <= 1
