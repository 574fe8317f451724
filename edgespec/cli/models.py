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
    """A path as is, or a registry name's cached file; never downloads (info and compat must be quick)."""
    from edgespec.models.fetch import cached_path

    candidate = Path(ref).expanduser()
    if candidate.exists():
        return candidate
    if ref in registry.models:
        hit = cached_path(registry.models[ref])
        if hit is None:
            raise ModelNotFoundError(f"model '{ref}' is not pulled yet; run `edgespec models pull {ref}`")
        return hit
    if ref.endswith(".gguf") or "/" in ref:
        raise ModelNotFoundError(f"no such file: {ref}")
    registry.model(ref)
    raise AssertionError("unreachable")


@click.group("models")
def models() -> None:
    """Named models: list, pull, verify, path, rm, info, compat."""


@models.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_friendly
def list_models(as_json: bool) -> None:
    """Registry models and pairs, and which models are in the cache."""
    from edgespec.models.fetch import cached_path

    registry = load_registry()
    rows = []
    for spec in registry.models.values():
        hit = cached_path(spec)
        rows.append(
            {
                "name": spec.name,
                "role": spec.role,
                "size": spec.size,
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
                _human(r["size"]),
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


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@models.command("pull")
@click.argument("refs", nargs=-1, required=True, metavar="NAME|PAIR...")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
@_friendly
def pull(refs: tuple[str, ...], quiet: bool) -> None:
    """Fetch models (a pair fetches its target and draft) into the cache; prints each path."""
    from edgespec.models.fetch import ensure_model

    registry = load_registry()
    specs = [spec for ref in refs for spec in _specs_for(registry, ref)]
    for spec in dict.fromkeys(specs):
        path = ensure_model(spec, progress=not quiet)
        click.echo(f"{spec.name}\t{path}")


@models.command("verify")
@click.argument("refs", nargs=-1, metavar="[NAME|PAIR]...")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
@_friendly
def verify(refs: tuple[str, ...], quiet: bool) -> None:
    """Re-hash cached models (all of them when none is named) against the registry."""
    from edgespec.models.fetch import cache_path, verify_cached

    registry = load_registry()
    named = bool(refs)
    specs = (
        [s for ref in refs for s in _specs_for(registry, ref)] if named else list(registry.models.values())
    )
    bad, checked = [], 0
    for spec in dict.fromkeys(specs):
        if not named and not cache_path(spec).exists():
            continue
        result = verify_cached(spec, progress=not quiet)
        if result is None:
            raise ModelNotFoundError(
                f"model '{spec.name}' is not pulled; run `edgespec models pull {spec.name}`"
            )
        checked += 1
        click.echo(f"{spec.name}\t{'ok' if result else 'BAD'}")
        if not result:
            bad.append(spec.name)
    if bad:
        raise EdgespecError(
            f"{', '.join(bad)} failed verification (marked not cached); "
            f"run `edgespec models pull {' '.join(bad)}` to fetch again"
        )
    if checked == 0:
        click.echo("nothing is cached", err=True)


@models.command("path")
@click.argument("ref", metavar="NAME")
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
@click.argument("ref", metavar="PATH|NAME")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_friendly
def info(ref: str, as_json: bool) -> None:
    """Check a GGUF file (preflight) and print what it is: architecture, quantization, context, vocabulary."""
    from edgespec.models.gguf import preflight

    facts = preflight(_local_file(load_registry(), ref)).facts()
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    for key, value in facts.items():
        click.echo(f"{key + ':':<19}{value}")


@models.command("compat")
@click.argument("target", metavar="TARGET")
@click.argument("draft", metavar="DRAFT")
@_friendly
def compat(target: str, draft: str) -> None:
    """Check from metadata alone that DRAFT can draft for TARGET (paths or pulled model names)."""
    from edgespec.models.gguf import check_vocab_compatible, preflight

    registry = load_registry()
    t_info = preflight(_local_file(registry, target))
    d_info = preflight(_local_file(registry, draft))
    check_vocab_compatible(t_info, d_info)
    click.echo(
        f"compatible: {t_info.label()} and {d_info.label()} share a vocabulary ({t_info.n_vocab} tokens)"
    )
