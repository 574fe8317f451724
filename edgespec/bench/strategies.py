"""The strategies a bench compares, by the names ``--strategies`` takes (see :mod:`edgespec.bench.runner`), and the
engine each name runs."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from edgespec.errors import EdgespecError

if TYPE_CHECKING:
    from edgespec.engine import Engine
    from edgespec.models.backend import Model

PLAIN = "plain"
ENGINE_STRATEGIES = ("plain", "draft-2", "draft-3", "draft-4", "lookup", "auto", "auto-nocache")
# auto drafts from earlier replies too (a suffix cache of one scope, as edgespec.load's default); auto-nocache does not
AUTO = ("auto", "auto-nocache")
PEER_STRATEGIES = ("llama-cpp", "llama-cpp-lookup")
DEFAULT_LOOKUP_LEN = 4  # γ for fixed lookup; on a CPU a wider verify costs ~half a step per token
WARMUP_TOKENS = 8
DRAFT_N = re.compile(r"draft-(\d+)")


def parse_strategies(names: Iterable[str], *, has_draft: bool) -> list[str]:
    """Validate strategy names; ``plain`` is always run (first) because every speedup is relative to it."""
    out = [PLAIN]
    for name in names:
        name = name.strip()
        if not name or name in out:
            continue
        m = DRAFT_N.fullmatch(name)
        if m and not 1 <= int(m.group(1)) <= 64:
            raise EdgespecError(f"{name}: γ must be 1..64")
        if not (m or name in ENGINE_STRATEGIES or name in PEER_STRATEGIES):
            known = ", ".join((*ENGINE_STRATEGIES, *PEER_STRATEGIES))
            raise EdgespecError(f"unknown strategy {name!r}; known: {known} (draft-N for any γ = N)")
        if m and not has_draft:
            continue  # no draft model loaded: the caller says so
        out.append(name)
    return out


def engine_for(
    name: str, target: Model, draft: Model | None, lookup_len: int, p_min: float, parallel: int = 1
) -> Engine:
    from edgespec.api import GLOBAL_SCOPE
    from edgespec.drafters.suffix_cache import SuffixCache
    from edgespec.engine import Engine

    if name == PLAIN:
        return Engine(target, None, draft_len=0, lookup=False, parallel=parallel)
    if name == "lookup":
        return Engine(target, None, draft_len=lookup_len, lookup=True, parallel=parallel)
    if name in AUTO:
        cache = SuffixCache() if name == "auto" else None
        return Engine(
            target, draft, draft_len="auto", lookup=True, p_min=p_min, parallel=parallel, suffix_cache=cache,
            cache_scope=GLOBAL_SCOPE,
        )  # fmt: skip
    gamma = int(DRAFT_N.fullmatch(name).group(1))  # type: ignore[union-attr]
    return Engine(target, draft, draft_len=gamma, lookup=False, p_min=p_min, parallel=parallel)
