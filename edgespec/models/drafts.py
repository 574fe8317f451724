"""Choosing a draft model for a target from the models already here: the registry's cached ones and the scanned.

A candidate must be compatible by llama.cpp's rules (:mod:`edgespec.models.vocab`) and much smaller than the
target: at most 1/4 of its parameters. When no candidate is that small, one of at most 1/2 is still taken (the
0.5B draft of the 1.5B target is 35 %), and the line saying so tells the user it is a weaker choice. Among the
candidates the same family comes first (Qwen2.5-Coder drafts for Qwen2.5-Coder before Qwen2.5 does), then a
quantization of 4 bits or more, then the fewest parameters, then the higher-quality quantization of the same
weights (Q8_0 before Q4_K_M of one model), then the smaller file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from edgespec.errors import ModelError
from edgespec.models.catalog import load_registry
from edgespec.models.discovery import ModelFacts, ScanResult, inspect, scan
from edgespec.models.vocab import incompatibility

__all__ = [
    "Candidate", "DraftChoice", "Ranked", "Rejected", "choose_draft", "draft_candidates", "family", "format_params",
    "quant_bits", "rank",
]  # fmt: skip

AIM = 1 / 4  # a draft this small or smaller is what speculation wants
LIMIT = 1 / 2  # beyond this a draft costs too much of a target step to pay anywhere
_SIZE_WORD = re.compile(r"^(\d+(\.\d+)?[bmk]|\d+x\d+(\.\d+)?b|a\d+(\.\d+)?b)$", re.IGNORECASE)


@dataclass(frozen=True)
class Candidate:
    ref: str  # how to name it on the command line: a registry name or a scanned id
    source: str  # "registry" or the scan's source
    facts: ModelFacts

    @property
    def path(self) -> Path:
        return self.facts.path


@dataclass(frozen=True)
class Ranked:
    candidate: Candidate
    share: float  # of the target's parameters
    same_family: bool
    reason: str


@dataclass(frozen=True)
class Rejected:
    candidate: Candidate
    reason: str


@dataclass(frozen=True)
class DraftChoice:
    path: Path | None  # None: no draft model; prompt lookup alone drafts
    ref: str | None
    line: str  # one line for the user: which draft and why, or why none


# ---------------------------------------------------------------------------------------------- facts


def family(facts: ModelFacts) -> str | None:
    """The words before the size in a model's name: 'Qwen2.5 Coder 0.5B Instruct' -> 'qwen2.5 coder'.

    The GGUF's general.name first, the file name when the name has no size in it.
    """
    for text in (facts.info.name, facts.path.name.removesuffix(".gguf")):
        words = [w for w in re.split(r"[\s_-]+", (text or "").lower()) if w]
        for i, word in enumerate(words):
            if _SIZE_WORD.match(word):
                return " ".join(words[:i]) or None
    return None


def quant_bits(quantization: str | None) -> int | None:
    """Nominal bits per weight of a quantization name: Q4_K_M -> 4, IQ2_XS -> 2, Q8_0 -> 8, BF16 -> 16."""
    match = re.search(r"(\d+)", quantization or "")
    return int(match.group(1)) if match else None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def draft_candidates(target: Path, scanned: ScanResult | None = None) -> list[Candidate]:
    """The registry's cached models and the scanned ones, each file once, the target itself left out."""
    from edgespec.models.fetch import cached_path  # lazy: its imports (tqdm, filelock) only when drafts are sought

    scanned = scanned if scanned is not None else scan()
    out: list[Candidate] = []
    for spec in load_registry().models.values():
        hit = cached_path(spec)
        if hit is None or _same_file(hit, target) or any(_same_file(hit, c.path) for c in out):
            continue
        try:
            out.append(Candidate(spec.name, "registry", inspect(hit)))
        except ModelError:
            continue  # a cached file that fails preflight is `models verify`'s business, not a draft
    for found in scanned.found:
        if _same_file(found.path, target) or any(_same_file(found.path, c.path) for c in out):
            continue
        out.append(Candidate(found.id, found.source, found.facts))
    return out


# ---------------------------------------------------------------------------------------------- ranking


def rank(target: ModelFacts, candidates: Sequence[Candidate]) -> tuple[list[Ranked], list[Rejected]]:
    """Compatible drafts best first, each with the reason for its place; and the others with why not."""
    ranked: list[Ranked] = []
    rejected: list[Rejected] = []
    target_family = family(target)
    for candidate in candidates:
        facts = candidate.facts
        why_not = incompatibility(target.info, facts.info, fingerprints=(target.fingerprint, facts.fingerprint))
        if why_not is not None:
            rejected.append(Rejected(candidate, f"incompatible: {why_not}"))
            continue
        share = facts.n_params / target.n_params if target.n_params else 1.0
        if share > LIMIT:
            rejected.append(
                Rejected(candidate, f"shares the vocabulary but has {share:.0%} of the target's parameters")
            )
            continue
        same = target_family is not None and family(facts) == target_family
        ranked.append(Ranked(candidate, share, same, _reason(facts, share, same, target_family)))
    ranked.sort(key=_order)
    return ranked, rejected


def _order(r: Ranked) -> tuple:
    facts = r.candidate.facts
    bits = quant_bits(facts.info.quantization) or 16
    return (r.share > AIM, not r.same_family, bits < 4, facts.n_params, -min(bits, 8), facts.size, r.candidate.ref)


def _reason(facts: ModelFacts, share: float, same_family: bool, target_family: str | None) -> str:
    parts = [f"same family ({target_family})" if same_family else "shares the vocabulary"]
    size = f"{format_params(facts.n_params)} parameters, {share:.0%} of the target's"
    parts.append(size if share <= AIM else f"{size} (more than the 1/4 a draft should be)")
    quant = facts.info.quantization or "unknown quantization"
    bits = quant_bits(facts.info.quantization)
    parts.append(f"{quant} (low quality)" if bits is not None and bits < 4 else quant)
    return ", ".join(parts)


def format_params(n: int) -> str:
    """630167424 -> '630M', 1777088000 -> '1.78B'."""
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    return f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


# ---------------------------------------------------------------------------------------------- choosing


def choose_draft(target: Path, *, target_name: str | None = None, scanned: ScanResult | None = None) -> DraftChoice:
    """The best draft for ``target`` among the models here, or none, with one line saying which and why."""
    target_facts = inspect(target)
    name = target_name or target.name
    ranked, rejected = rank(target_facts, draft_candidates(target, scanned))
    if ranked:
        best = ranked[0]
        where = "registry" if best.candidate.source == "registry" else f"found in {best.candidate.source}"
        return DraftChoice(
            best.candidate.path,
            best.candidate.ref,
            f"draft: {best.candidate.ref} ({where}) for {name}: {best.reason}",
        )
    if any(r.reason.startswith("shares the vocabulary") for r in rejected):
        why = "the models that share its vocabulary are not much smaller"
    else:
        why = "no model here shares its vocabulary"
    return DraftChoice(None, None, f"draft: none for {name} ({why}); prompt lookup alone will draft")
