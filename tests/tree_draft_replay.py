"""The draft model's top-k as a tree source, against its chain, on the recorded outputs at the H200's costs.

    .venv/bin/python tests/tree_draft_replay.py

Each recorded reply (tests/data/qwen_traces.json, the bench's classes, and tests/data/agent_traces.json) is the Qwen
1.5B target's own greedy text. The Qwen 0.5B draft model reads it teacher-forced (one batched decode of prompt and
reply, every reply position scored), which gives, at each position, the rank of the recorded token in the draft's
distribution given the recorded text before it. That is all a greedy replay needs: a drafted token is accepted
exactly when it is the recorded one, so

* a *chain* of γ accepts as many tokens as the ranks from here are 0 in a row (up to γ), its draft taking γ draft
  decodes of one row;
* a static *tree* of branchings ``(k1, .., kd)`` (the draft's top-k_i at every node of depth i - 1) accepts as many
  as the ranks from here are below k1, k2, .. in a row: its rows are k1 + k1 k2 + .., its draft d decodes of
  widths 1, k1, k1 k2, ..; an accepted path that leaves the draft's top-1 path pays one more target decode of the
  rest of it (edgespec.models.tree_kv.keep_path decodes it again), except "kept in place".

Target decodes are priced at ``H200_PROFILE``'s curve for the 1.5B, the draft's at its per-token cost on the same
curve's shape, and each model pays 1 ms when a decode's width differs from its last one's (a new graph), as the GPU
emulation prices the target. Rounds that catch the draft model up (the bonus token, an accepted side path) are not
charged to either policy. The table gives each policy's speed over plain decoding at its best γ or shape, pooled over
a class's replies.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from edgespec.drafters.controller_sim import H200_PROFILE

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tree_replay import Clock  # noqa: E402  # the same decode pricing as the chain/tree replay of earlier occurrences

DATA = Path(__file__).resolve().parent / "data"
SWITCHES = (0.001, 0.0)  # as the GPU emulation prices a new graph, and free (the bound for a backend without graphs)
GAMMAS = range(1, 9)
SHAPES = ((2,), (3,), (2, 1), (3, 1), (2, 2), (2, 1, 1), (3, 1, 1), (2, 2, 1), (2, 1, 1, 1), (2, 2, 1, 1), (4, 1, 1))


def ranks(draft, prompt: Sequence[int], output: Sequence[int], chunk: int = 64) -> list[int]:  # noqa: ANN001
    """At each reply position, how many tokens the draft model ranks above the recorded one, given the text before."""
    draft.truncate(0)
    draft.decode(list(prompt[:-1]))
    feed = [prompt[-1], *output[:-1]]
    out: list[int] = []
    for start in range(0, len(feed), chunk):
        part = feed[start : start + chunk]
        logits = np.asarray(draft.decode(part, range(len(part))))
        truth = np.asarray(output[start : start + len(part)])
        mine = logits[np.arange(len(part)), truth]
        out.extend(int(r) for r in (logits > mine[:, None]).sum(axis=1))
    return out


def replay(all_ranks: list[list[int]], policy: str, shape: Sequence[int], switch: float) -> float:
    """Seconds of every reply under ``policy`` ("plain", "chain": ``shape`` = (1,) * γ, "tree", "tree, kept in place"),
    ``switch`` seconds added to a decode whose width differs from its model's last one."""
    per_draft_row = H200_PROFILE.draft["model"] / H200_PROFILE.t_token  # the draft's decodes: the curve's shape, scaled
    target = Clock(H200_PROFILE.verify, switch)
    draft = Clock(lambda rows: per_draft_row * H200_PROFILE.verify(rows), switch)
    for r in all_ranks:
        i = 0
        while i < len(r):
            if policy == "plain":
                target.decode(1)
                i += 1
                continue
            depth = min(len(shape), len(r) - i - 1)
            accepted = 0
            while accepted < depth and r[i + accepted] < shape[accepted]:
                accepted += 1
            width = 1
            for level in range(depth):
                draft.decode(width)
                width *= shape[level]
            rows = sum(int(np.prod(shape[: d + 1])) for d in range(depth))
            target.decode(1 + rows)
            side = next((k for k in range(accepted) if r[i + k] > 0), accepted)
            if policy == "tree" and accepted > side:
                target.decode(accepted - side)
            i += accepted + 1
    return target.seconds + draft.seconds


def main() -> None:
    from edgespec.models.backend import Model
    from edgespec.models.registry import resolve_model

    traces = json.loads((DATA / "qwen_traces.json").read_text())["traces"]
    traces += [t for t in json.loads((DATA / "agent_traces.json").read_text())["traces"] if t["task"] == "agent"]
    by_class: dict[str, list[list[int]]] = {}
    with Model(resolve_model("qwen2.5-coder-0.5b", progress=False), n_ctx=4096) as draft:
        for t in traces:
            by_class.setdefault(t["task"], []).append(ranks(draft, t["prompt"], t["output"]))
    for switch in SWITCHES:
        print(f"\nspeed over plain at the H200 curve, {switch * 1e3:g} ms a change of width (best gamma / shape);")
        print("top-1 and top-2: the share of recorded tokens the draft model ranks first, or first or second")
        print(f"{'class':<10} {'top1':>5} {'top2':>5} {'chain':>20} {'tree':>22} {'kept in place':>22}")
        for name, all_ranks in by_class.items():
            flat = [x for r in all_ranks for x in r]
            plain = replay(all_ranks, "plain", (), switch)
            chain = max((plain / replay(all_ranks, "chain", (1,) * g, switch), g) for g in GAMMAS)
            tree = max((plain / replay(all_ranks, "tree", s, switch), s) for s in SHAPES)
            kept = max((plain / replay(all_ranks, "tree, kept in place", s, switch), s) for s in SHAPES)
            cells = [f"{v:.3f}x {str(s if isinstance(s, tuple) else f'γ={s}'):>12}" for v, s in (chain, tree, kept)]
            top1, top2 = np.mean([x == 0 for x in flat]), np.mean([x < 2 for x in flat])
            print(f"{name:<10} {top1:5.2f} {top2:5.2f} {cells[0]:>20} {cells[1]:>22} {cells[2]:>22}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
