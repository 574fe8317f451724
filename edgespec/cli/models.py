"""`edgespec models ...`: list, pull, verify, locate, remove and inspect models.

Every command turns an :class:`EdgespecError` into ``error: <message>`` on stderr and exit status 1, never a
traceback. Data goes to stdout, progress and notes to stderr, so ``$(edgespec models path NAME)`` works.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from edgespec.errors import EdgespecError, ModelNotFoundError
from edgespec.models.registry import ModelSpec, Registry, cache_dir, load_registry

__all__ = ["models"]

F = TypeVar("F", bound=Callable[..., Any])


def _friendly(func: F) -> F:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except EdgespecError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)

    return wrapper  # type: ignore[return-value]


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def _specs_for(registry: Registry, ref: str) -> list[ModelSpec]:
    """A model name gives that model; a pair name gives its target and draft (once if they are the same)."""
    if ref in registry.models:
        return [registry.models[ref]]
    if ref in registry.pairs:
        pair = registry.pairs[ref]
        names = dict.fromkeys((pair.target, pair.draft))
        return [registry.model(name) for name in names]
    registry.model(ref)  # raises the "unknown model, did you mean" error
    raise AssertionError("unreachable")


def _local_file(registry: Registry, ref: str) -> Path:
    """A path as is, a pulled hub reference or registry name, or a scanned model's id; never downloads (info
    and compat must be quick)."""
    from edgespec.models.fetch import cached_path
    from edgespec.models.hub import cached_hub, parse_hub_ref

    candidate = Path(ref).expanduser()
    if candidate.exists():
        return candidate
    hub_ref = parse_hub_ref(ref)
    if hub_ref is not None:
        hit = cached_hub(hub_ref)
        if hit is None:
            raise ModelNotFoundError(f"{ref} is not downloaded yet; run `edgespec models pull {ref}`")
        return hit
    if ref in registry.models:
        hit = cached_path(registry.models[ref])
        if hit is None:
            raise ModelNotFoundError(f"model '{ref}' is not pulled yet; run `edgespec models pull {ref}`")
        return hit
    if ref.endswith(".gguf") or "/" in ref:
        raise ModelNotFoundError(f"no such file: {ref}")
    found = _scan(registry).find(ref)
    if found is not None:
        return found.path
    registry.model(ref)
    raise AssertionError("unreachable")


def _scan(registry: Registry):
    from edgespec.models.discovery import scan

    return scan(registry.scan_folders, [*registry.models, *registry.pairs])


def _params(n: int) -> str:
    from edgespec.models.drafts import format_params

    return format_params(n)


@click.group("models")
def models() -> None:
    """Models by name, by hf: reference and found on this machine: list, scan, pull, verify, path, rm, info,
    compat."""


@models.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_friendly
def list_models(as_json: bool) -> None:
    """Registry models and pairs, which are in the cache, then the models found on this machine."""
    from edgespec.models.fetch import cached_path

    registry = load_registry()
    found = _scan(registry).found
    rows = []
    for spec in registry.models.values():
        hit = cached_path(spec)
        rows.append(
            {
                "name": spec.name,
                "role": spec.role,
                "size": spec.size,
                "checked": spec.checked,
                "quantization": spec.quantization,
                "family": spec.family,
                "context_length": spec.context_length,
                "license": spec.license,
                "cached": hit is not None,
                "path": str(hit) if hit else None,
                "pairs": registry.pairs_of(spec.name),
            }
        )
    pairs = [
        {"name": p.name, "target": p.target, "draft": p.draft, "draft_len": p.draft_len, "default": p.default}
        for p in registry.pairs.values()
    ]
    if as_json:
        doc = {"cache": str(cache_dir()), "default_pair": registry.default_pair_name, "models": rows}
        doc["pairs"] = pairs
        doc["found"] = [m.as_dict() for m in found]
        click.echo(json.dumps(doc, indent=2))
        return
    star = {registry.default_pair_name: "*"}
    table = [("NAME", "ROLE", "SIZE", "QUANT", "CACHED", "PAIRS")]
    for r in rows:
        in_pairs = ",".join(p + star.get(p, "") for p in r["pairs"]) or "-"
        table.append(
            (
                r["name"],
                r["role"],
                _human(r["size"]) if r["checked"] else "? (hub)",
                r["quantization"] or "?",
                "yes" if r["cached"] else "no",
                in_pairs,
            )
        )
    _print_table(table)
    click.echo()
    ptable = [("PAIR", "TARGET", "DRAFT", "DRAFT_LEN")]
    ptable += [
        (p["name"] + star.get(p["name"], ""), p["target"], p["draft"], str(p["draft_len"])) for p in pairs
    ]
    _print_table(ptable)
    click.echo(f"\n* default pair    cache: {cache_dir()}")
    if any(not r["checked"] for r in rows):
        click.echo("? (hub): not downloaded and checked when the registry was written; the hub's sha256 is the check")
    if found:
        click.echo()
        _print_found(found)


def _print_found(found: list) -> None:
    table = [("FOUND", "SOURCE", "PARAMS", "QUANT", "SIZE", "WHERE")]
    for m in found:
        quant = m.facts.info.quantization or "?"
        table.append((m.id, m.source, _params(m.facts.n_params), quant, _human(m.facts.size), m.label))
    _print_table(table)


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@models.command("pull")
@click.argument("refs", nargs=-1, required=True, metavar="NAME|PAIR|hf:ORG/REPO[:QUANT]...")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
@_friendly
def pull(refs: tuple[str, ...], quiet: bool) -> None:
    """Fetch models (a pair fetches its target and draft, hf:ORG/REPO[:QUANT] a hub model) into the cache;
    prints each path."""
    from edgespec.models.fetch import ensure_model
    from edgespec.models.hub import fetch_hub, parse_hub_ref

    registry = load_registry()
    for ref in refs:  # each is checked before anything downloads
        if parse_hub_ref(ref) is None:
            _specs_for(registry, ref)
    done: set[str] = set()
    for ref in refs:
        hub_ref = parse_hub_ref(ref)
        if hub_ref is not None:
            click.echo(f"{ref}\t{fetch_hub(hub_ref, progress=not quiet)}")
            continue
        for spec in _specs_for(registry, ref):
            if spec.name not in done:
                done.add(spec.name)
                click.echo(f"{spec.name}\t{ensure_model(spec, progress=not quiet)}")


@models.command("verify")
@click.argument("refs", nargs=-1, metavar="[NAME|PAIR|hf:ORG/REPO[:QUANT]]...")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
@_friendly
def verify(refs: tuple[str, ...], quiet: bool) -> None:
    """Re-hash cached models (all of them when none is named) against the registry or the hub's sha256."""
    from edgespec.models.fetch import verify_cached
    from edgespec.models.hub import parse_hub_ref, verify_hub

    registry = load_registry()
    named = bool(refs)
    checks: dict[str, Callable[[], bool | None]] = {}
    for ref in refs:
        hub_ref = parse_hub_ref(ref)
        if hub_ref is not None:
            checks[ref] = functools.partial(verify_hub, hub_ref, progress=not quiet)
            continue
        for spec in _specs_for(registry, ref):
            checks[spec.name] = functools.partial(verify_cached, spec, progress=not quiet)
    if not named:
        checks = {s.name: functools.partial(verify_cached, s, progress=not quiet) for s in registry.models.values()}
    bad, checked = [], 0
    for name, check in checks.items():
        result = check()
        if result is None:
            if not named:
                continue
            raise ModelNotFoundError(f"model '{name}' is not pulled; run `edgespec models pull {name}`")
        checked += 1
        click.echo(f"{name}\t{'ok' if result else 'BAD'}")
        if not result:
            bad.append(name)
    if bad:
        raise EdgespecError(
            f"{', '.join(bad)} failed verification (marked not cached); "
            f"run `edgespec models pull {' '.join(bad)}` to fetch again"
        )
    if checked == 0:
        click.echo("nothing is cached", err=True)


@models.command("path")
@click.argument("ref", metavar="NAME|ID|hf:...")
@_friendly
def path(ref: str) -> None:
    """Print the cached file of a model (exit 1 if it is not pulled)."""
    click.echo(str(_local_file(load_registry(), ref)))


@models.command("rm")
@click.argument("refs", nargs=-1, required=True, metavar="NAME|PAIR...")
@_friendly
def rm(refs: tuple[str, ...]) -> None:
    """Remove models from the cache."""
    from edgespec.models.fetch import remove_cached

    registry = load_registry()
    for spec in dict.fromkeys(s for ref in refs for s in _specs_for(registry, ref)):
        click.echo(f"{spec.name}\t{'removed' if remove_cached(spec) else 'not cached'}")


@models.command("info")
@click.argument("ref", metavar="PATH|NAME|ID|hf:...")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_friendly
def info(ref: str, as_json: bool) -> None:
    """Check a GGUF file (preflight) and print what it is: architecture, quantization, context, vocabulary."""
    from edgespec.models.discovery import inspect
    from edgespec.models.gguf import preflight

    path = _local_file(load_registry(), ref)
    facts = preflight(path).facts()
    facts["n_params"] = inspect(path).n_params  # all parts of a split model
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    for key, value in facts.items():
        click.echo(f"{key + ':':<19}{value}")


@models.command("compat")
@click.argument("target", metavar="TARGET")
@click.argument("draft", metavar="[DRAFT]", required=False)
@click.option("--all", "show_all", is_flag=True, help="Also list the models that cannot draft, and why.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_friendly
def compat(target: str, draft: str | None, show_all: bool, as_json: bool) -> None:
    """Rank every model here that can draft for TARGET, with the reason; with DRAFT, check that one pair.

    From metadata alone (no weights load). TARGET and DRAFT are paths, pulled names, hf: references or ids from
    `edgespec models scan`.
    """
    from edgespec.models.gguf import preflight
    from edgespec.models.vocab import check_vocab_compatible

    registry = load_registry()
    if draft is not None:
        t_info = preflight(_local_file(registry, target))
        d_info = preflight(_local_file(registry, draft))
        check_vocab_compatible(t_info, d_info)
        click.echo(
            f"compatible: {t_info.label()} and {d_info.label()} share a vocabulary ({t_info.n_vocab} tokens)"
        )
        return
    _rank_drafts(registry, target, show_all, as_json)


def _rank_drafts(registry: Registry, target: str, show_all: bool, as_json: bool) -> None:
    from edgespec.models.discovery import inspect
    from edgespec.models.drafts import choose_draft, draft_candidates, rank

    target_path = _local_file(registry, target)
    scanned = _scan(registry)
    ranked, rejected = rank(inspect(target_path), draft_candidates(target_path, scanned))
    if as_json:
        doc = {
            "target": str(target_path),
            "drafts": [
                {"id": r.candidate.ref, "path": str(r.candidate.path), "source": r.candidate.source,
                 "n_params": r.candidate.facts.n_params, "share": round(r.share, 4), "reason": r.reason}
                for r in ranked
            ],
            "rejected": [
                {"id": r.candidate.ref, "path": str(r.candidate.path), "source": r.candidate.source,
                 "reason": r.reason}
                for r in rejected
            ],
        }  # fmt: skip
        click.echo(json.dumps(doc, indent=2))
        return
    if ranked:
        table = [("RANK", "DRAFT", "SOURCE", "PARAMS", "SHARE", "WHY")]
        for i, r in enumerate(ranked, 1):
            c = r.candidate
            table.append((str(i), c.ref, c.source, _params(c.facts.n_params), f"{r.share:.0%}", r.reason))
        _print_table(table)
    click.echo(choose_draft(target_path, target_name=target, scanned=scanned).line)
    if show_all and rejected:
        click.echo()
        rows = [(r.candidate.ref, r.candidate.source, r.reason) for r in rejected]
        _print_table([("CANNOT DRAFT", "SOURCE", "WHY"), *rows])


@models.command("scan")
@click.option("--json", "as_json", is_flag=True, help="A JSON list of the models found.")
@click.option("-v", "--verbose", is_flag=True, help="Also say where it looked and what it skipped, and why.")
@_friendly
def scan_models(as_json: bool, verbose: bool) -> None:
    """Find GGUF models other tools keep here: the Hugging Face cache, LM Studio, Ollama, llama.cpp's cache and
    the [scan] folders of your models.toml. Read-only; each model can then be named by its id or path."""
    result = _scan(load_registry())
    if verbose:
        for source, root in result.locations:
            click.echo(f"looked in {root} ({source}){'' if root.is_dir() else ': not there'}", err=True)
        for s in result.skipped:
            click.echo(f"skipped {s.path} ({s.source}): {s.reason}", err=True)
    if as_json:
        click.echo(json.dumps([m.as_dict() for m in result.found], indent=2))
        return
    if result.found:
        _print_found(result.found)
    else:
        click.echo("no GGUF models found (`edgespec models scan -v` says where it looked)", err=True)
