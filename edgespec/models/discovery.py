"""GGUF models already on this machine, found where other tools keep them; never copied, moved or written to.

Where it looks, in this order (the first place a file is found names it when the same file is in two):

- the Hugging Face cache (``huggingface_hub.scan_cache_dir``; $HF_HUB_CACHE, $HF_HOME/hub, else
  ~/.cache/huggingface/hub), which also holds current llama.cpp's ``-hf`` downloads;
- LM Studio: ~/.lmstudio/models/PUBLISHER/REPO/FILE.gguf, and the older ~/.cache/lm-studio/models;
- Ollama: $OLLAMA_MODELS, else ~/.ollama/models and /usr/share/ollama/.ollama/models; a manifest's
  ``application/vnd.ollama.image.model`` layer is a plain GGUF blob;
- llama.cpp's older cache: $LLAMA_CACHE, else ~/.cache/llama.cpp (flat files, or a Hugging Face style cache);
- the folders in the user's models.toml: ``[scan] folders = ["~/models"]``.

Every candidate passes the GGUF preflight before it is listed; broken blobs, other files named .gguf, dangling
links and split models with a missing part are skipped, with the reason kept for ``models scan -v``. Each
model gets an id: its file name in lower case without ``.gguf`` (an Ollama model its ``name:tag``), qualified
with ``@source`` when another model or a registry name already has it.

The one thing written is a record of vocabulary fingerprints in edgespec's own cache (``.fingerprints.json``,
keyed by path, size and mtime), so a scan reads each token list once, not on every run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgespec.errors import ModelError
from edgespec.models.catalog import load_registry
from edgespec.models.gguf import GGUFInfo, preflight
from edgespec.models.hub import hf_cache_dir, is_model_file, split_info
from edgespec.models.vocab import fingerprint
from edgespec.paths import state_dir

__all__ = ["FoundModel", "ModelFacts", "ScanResult", "Skipped", "inspect", "scan", "scan_locations"]

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
_MAX_DEPTH = {"lmstudio": 4, "folder": 8, "llama.cpp": 1}


@dataclass(frozen=True)
class ModelFacts:
    """A preflighted model and what the scan and draft ranking need, over all parts of a split model."""

    path: Path  # the file to load (the first part of a split model)
    info: GGUFInfo
    n_params: int
    size: int  # bytes, all parts
    parts: int
    fingerprint: str  # of the vocabulary (tokenizer and token texts)


@dataclass(frozen=True)
class FoundModel:
    id: str
    source: str  # "hf", "lmstudio", "ollama", "llama.cpp" or "folder"
    label: str  # where the source has it: repo/file, publisher/repo/file, an Ollama name:tag, a relative path
    facts: ModelFacts

    @property
    def path(self) -> Path:
        return self.facts.path

    def as_dict(self) -> dict[str, Any]:
        info = self.facts.info
        return {
            "id": self.id,
            "path": str(self.path),
            "source": self.source,
            "label": self.label,
            "arch": info.architecture,
            "name": info.name,
            "size": self.facts.size,
            "quant": info.quantization,
            "n_params": self.facts.n_params,
            "vocab": self.facts.fingerprint,
            "n_vocab": info.n_vocab,
            "tokenizer": info.tokenizer_model,
            "context_length": info.context_length,
            "parts": self.facts.parts,
        }


@dataclass(frozen=True)
class Skipped:
    path: Path
    source: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"path": str(self.path), "source": self.source, "reason": self.reason}


@dataclass(frozen=True)
class ScanResult:
    found: list[FoundModel]
    skipped: list[Skipped]
    locations: list[tuple[str, Path]]  # what was looked at (existing or not)

    def find(self, ref: str) -> FoundModel | None:
        """The found model named by ``ref``: its id (any case) or its path (any link to the same file)."""
        wanted = ref.lower()
        for model in self.found:
            if model.id == wanted:
                return model
        key = _identity(Path(ref).expanduser())
        if key is None:
            return None
        return next((m for m in self.found if _identity(m.path) == key), None)


@dataclass(frozen=True)
class _Candidate:
    path: Path
    source: str
    label: str
    name: str  # what the id grows from


# ---------------------------------------------------------------------------------------------- locations


def scan_locations(folders: Sequence[Path] = ()) -> list[tuple[str, Path]]:
    """(source, folder) pairs in scanning order; read from the environment at call time."""
    home = Path.home()
    xdg_cache = Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache").expanduser()
    places = [("hf", hf_cache_dir())]
    places += [("lmstudio", home / ".lmstudio" / "models"), ("lmstudio", home / ".cache" / "lm-studio" / "models")]
    if os.environ.get("OLLAMA_MODELS"):
        places.append(("ollama", Path(os.environ["OLLAMA_MODELS"]).expanduser()))
    else:
        places += [("ollama", home / ".ollama" / "models"), ("ollama", Path("/usr/share/ollama/.ollama/models"))]
    llama_cache = os.environ.get("LLAMA_CACHE")
    places.append(("llama.cpp", Path(llama_cache).expanduser() if llama_cache else xdg_cache / "llama.cpp"))
    places += [("folder", Path(f)) for f in folders]
    return places


# ---------------------------------------------------------------------------------------------- scanning


def scan(folders: Sequence[Path] | None = None, reserved: Sequence[str] | None = None) -> ScanResult:
    """Every GGUF model in the usual places and ``folders`` (default: the registry's ``[scan] folders``).

    ``reserved`` are names ids must not take (default: the registry's model and pair names).
    """
    if folders is None or reserved is None:
        registry = load_registry()
        folders = registry.scan_folders if folders is None else folders
        reserved = [*registry.models, *registry.pairs] if reserved is None else reserved
    locations = scan_locations(folders)
    found: list[tuple[_Candidate, ModelFacts]] = []
    skipped: list[Skipped] = []
    seen: set[tuple[int, int]] = set()
    fingerprints = _FingerprintRecord()
    for source, root in locations:
        for item in _candidates(source, root):
            if isinstance(item, Skipped):
                skipped.append(item)
                continue
            key = _identity(item.path)
            if key is None:
                skipped.append(Skipped(item.path, source, _why_missing(item.path)))
                continue
            if key in seen:  # the same file through another link or another tool's folder
                continue
            try:
                facts = inspect(item.path, fingerprints)
            except ModelError as exc:  # (a split part may be whole in one folder and not in another)
                skipped.append(Skipped(item.path, source, str(exc)))
                continue
            seen.add(key)
            found.append((item, facts))
    fingerprints.save()
    ids = _assign_ids([c for c, _ in found], set(reserved))
    models = [FoundModel(i, c.source, c.label, f) for i, (c, f) in zip(ids, found, strict=True)]
    return ScanResult(models, skipped, locations)


def inspect(path: Path, fingerprints: _FingerprintRecord | None = None) -> ModelFacts:
    """Preflight ``path`` (and the other parts of a split model) and gather what ranking needs.

    Raises :class:`ModelError` when the file, or a part of it, is missing or broken.
    """
    info = preflight(path)
    prefix, index, count = split_info(path.name)
    n_params, size = info.n_params, info.file_size
    if count > 1:
        if index != 1:
            raise ModelError(f"{path} is part {index} of {count} of a split model; name its first part")
        for n in range(2, count + 1):
            part = path.with_name(f"{prefix}-{n:05d}-of-{count:05d}.gguf")
            if not part.is_file():
                raise ModelError(f"{path}: part {n} of {count} ({part.name}) is missing")
            n_params += _tensor_elements(part)
            size += part.stat().st_size
    record = fingerprints if fingerprints is not None else _FingerprintRecord()
    vocab = record.get(info) or record.put(info, fingerprint(info))
    if fingerprints is None:
        record.save()
    return ModelFacts(path, info, n_params, size, count, vocab)


def _tensor_elements(part: Path) -> int:
    """Element count of the tensors in a later part of a split model (it has no vocabulary to walk past)."""
    from gguf import GGUFReader  # its numpy views are cheap here: a later part holds only tensor records

    try:
        return sum(int(t.n_elements) for t in GGUFReader(part).tensors)
    except (OSError, ValueError) as exc:
        raise ModelError(f"{part}: not a readable GGUF part ({exc})") from None


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()  # follows links: two links to one file are one model
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _why_missing(path: Path) -> str:
    if path.is_symlink():
        return f"dangling link (to {os.readlink(path)})"
    return "cannot be read"


def _candidates(source: str, root: Path) -> Iterator[_Candidate | Skipped]:
    if not root.is_dir():
        return
    if source == "hf":
        yield from _hf_cache(root, source)
    elif source == "ollama":
        yield from _ollama(root)
    elif source == "llama.cpp":
        yield from _hf_cache(root, source)  # current llama.cpp keeps a Hugging Face style cache here
        yield from _files(root, source)
    else:
        yield from _files(root, source)


def _hf_cache(root: Path, source: str) -> Iterator[_Candidate | Skipped]:
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        cache = scan_cache_dir(root)
    except CacheNotFound:
        return
    parsed = set()
    for repo in sorted(cache.repos, key=lambda r: r.repo_id):
        parsed.add(repo.repo_path)
        if repo.repo_type != "model":
            continue
        # The revision a branch points to first; a detached one only for files no other revision has.
        revisions = sorted(repo.revisions, key=lambda r: (not r.refs, "main" not in r.refs, -r.last_modified))
        blobs: set[Path] = set()
        for revision in revisions:
            for f in sorted(revision.files, key=lambda f: f.file_path):
                inner = f.file_path.relative_to(revision.snapshot_path).as_posix()
                if f.blob_path in blobs or not _is_first_model_part(inner):
                    continue
                blobs.add(f.blob_path)
                yield _Candidate(f.file_path, source, f"{repo.repo_id}/{inner}", f.file_name)
    # scan_cache_dir drops a whole repo for one dangling link; walk those ourselves so the rest still shows.
    for folder in sorted(root.glob("models--*")):
        if folder in parsed or not (folder / "snapshots").is_dir():
            continue
        repo_id = folder.name.removeprefix("models--").replace("--", "/")
        for snapshot in sorted(p for p in (folder / "snapshots").iterdir() if p.is_dir()):
            for path in sorted(snapshot.rglob("*")):
                inner = path.relative_to(snapshot).as_posix()
                if _is_first_model_part(inner) and not path.is_dir():
                    yield _Candidate(path, source, f"{repo_id}/{inner}", path.name)


def _files(root: Path, source: str) -> Iterator[_Candidate]:
    """GGUF files under ``root``, at most ``_MAX_DEPTH[source]`` folders deep, following linked folders once."""
    max_depth = _MAX_DEPTH[source]
    visited: set[tuple[int, int]] = set()
    for folder, dirs, names in os.walk(root, followlinks=True):
        here = Path(folder)
        st = here.stat()
        if (st.st_dev, st.st_ino) in visited:  # a linked folder met before: a loop, or a second way in
            dirs[:] = []
            continue
        visited.add((st.st_dev, st.st_ino))
        deeper = len(here.relative_to(root).parts) + 1 < max_depth
        # Hidden folders are other tools' bookkeeping; models--* ones are a Hugging Face cache, scanned as such.
        dirs[:] = sorted(d for d in dirs if deeper and not d.startswith((".", "models--")))
        for name in sorted(names):
            path = here / name
            inner = path.relative_to(root).as_posix()
            if _is_first_model_part(inner):
                yield _Candidate(path, source, inner, name)


def _is_first_model_part(inner: str) -> bool:
    return is_model_file(inner) and split_info(inner.rsplit("/", 1)[-1])[1] == 1


def _ollama(root: Path) -> Iterator[_Candidate | Skipped]:
    """Models named by Ollama's manifests (manifests/HOST/NAMESPACE/MODEL/TAG)."""
    manifests = root / "manifests"
    if not manifests.is_dir():
        return
    for manifest in sorted(p for p in manifests.rglob("*") if p.is_file()):
        parts = manifest.relative_to(manifests).parts
        name = _ollama_name(parts)
        try:
            layers = json.loads(manifest.read_text(encoding="utf-8"))["layers"]
            digest = next(layer["digest"] for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_LAYER)
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
            yield Skipped(manifest, "ollama", f"{name}: not a readable Ollama manifest")
            continue
        except StopIteration:
            yield Skipped(manifest, "ollama", f"{name}: no model layer (a model kept elsewhere, e.g. in the cloud)")
            continue
        blob = root / "blobs" / str(digest).replace(":", "-")
        if not blob.exists() and (root / "blobs" / str(digest)).exists():  # the oldest Ollama kept the colon
            blob = root / "blobs" / str(digest)
        yield _Candidate(blob, "ollama", name, name)


def _ollama_name(parts: tuple[str, ...]) -> str:
    """``model:tag`` for the default registry's library, else ``[host/]namespace/model:tag``, as Ollama shows it."""
    if len(parts) < 2:
        return "/".join(parts)
    *path, model, tag = parts
    if path[:2] == ["registry.ollama.ai", "library"]:
        path = path[2:]
    elif path[:1] == ["registry.ollama.ai"]:
        path = path[1:]
    return "/".join([*path, model]) + f":{tag}"


# ---------------------------------------------------------------------------------------------- ids


def _base_id(candidate: _Candidate) -> str:
    name = candidate.name
    if candidate.source != "ollama":
        prefix, _, count = split_info(name)
        name = prefix if count > 1 else re.sub(r"\.gguf$", "", name, flags=re.IGNORECASE)
    return re.sub(r"[\s/\\]+", "-", name.lower())


def _assign_ids(candidates: list[_Candidate], reserved: set[str]) -> list[str]:
    """Short ids: the first model (in scanning order) with a name keeps it, later ones add ``@source``, and
    two in one source with one name add a hash of their path. The same files always get the same ids."""
    taken = {r.lower() for r in reserved}
    ids = []
    for candidate in candidates:
        base = _base_id(candidate)
        for option in (base, f"{base}@{candidate.source}"):
            if option not in taken:
                break
        else:
            digest = hashlib.sha1(str(candidate.path).encode()).hexdigest()[:6]
            option = f"{base}@{candidate.source}-{digest}"
        taken.add(option)
        ids.append(option)
    return ids


# ---------------------------------------------------------------------------------------------- fingerprints


class _FingerprintRecord:
    """Vocabulary fingerprints already computed, by file (path, size, mtime): reading a 150k-token list costs
    ~0.1 s, and a scan runs every time ``--draft auto`` does."""

    def __init__(self) -> None:
        self.path = state_dir() / ".fingerprints.json"
        try:
            self.known: dict[str, str] = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.known = {}
        self.changed = False

    @staticmethod
    def _key(info: GGUFInfo) -> str:
        st = info.path.stat()
        return f"{info.path.resolve()}\t{st.st_size}\t{st.st_mtime_ns}"

    def get(self, info: GGUFInfo) -> str | None:
        return self.known.get(self._key(info))

    def put(self, info: GGUFInfo, value: str) -> str:
        self.known[self._key(info)] = value
        self.changed = True
        return value

    def save(self) -> None:
        if not self.changed:
            return
        tmp = self.path.with_name(f".fingerprints.{os.getpid()}.partial")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Drop entries of files that are gone, so the record does not grow without bound.
            alive = {k: v for k, v in self.known.items() if Path(k.split("\t")[0]).exists()}
            tmp.write_text(json.dumps(alive, indent=0), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:  # best effort: an unwritable cache only means fingerprints are computed again
            tmp.unlink(missing_ok=True)
