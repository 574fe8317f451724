"""Hugging Face hub references: ``hf:ORG/REPO``, ``hf:ORG/REPO:QUANT`` and ``hf:ORG/REPO/FILE.gguf``.

A quant tag picks a file the way llama.cpp's ``-hf`` does (``find_best_model`` in common/download.cpp): the
first model file whose path contains the tag followed by ``.`` or ``-`` (case-insensitive); without a tag
Q4_K_M, then Q8_0, then the first model file. Projector, imatrix and draft-head files (mmproj, imatrix, mtp-,
eagle3-, dflash-, dspark-) are never models; a split model (``-00001-of-0000N.gguf``) is fetched whole and
loaded from its first part.

Files go through huggingface-hub into the standard Hugging Face cache (its progress bar; a dropped connection
resumes where it stopped) and are checked against the hub's LFS sha256 from the repo's file listing. A check
that passed is remembered in edgespec's own cache (``.hub-verified/``, keyed by digest, tied to the blob's
size and mtime), never in the Hugging Face cache, so a file is hashed once, not on every run. With
``HF_HUB_OFFLINE=1`` or the hub unreachable, a reference resolves from that cache alone.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from edgespec.errors import ModelError, ModelNotFoundError
from edgespec.models.progress import SilentTqdm, hash_file, say
from edgespec.paths import model_cache_dir

__all__ = [
    "HubFile",
    "HubRef",
    "cached_hub",
    "fetch_hub",
    "hf_cache_dir",
    "hub_endpoint",
    "is_model_file",
    "offline_reason",
    "parse_hub_ref",
    "pick_files",
    "split_info",
    "verify_hub",
]

PREFIX = "hf:"
_DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
_NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
_SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX40 = re.compile(r"[0-9a-f]{40}")
_PROBE_TIMEOUT_S = 3.0
# Outcome of the reachability probe per endpoint for this process: the note is printed once, and resolving a
# target and its draft does not probe (or wait) twice.
_unreachable: dict[str, str | None] = {}


@dataclass(frozen=True)
class HubRef:
    repo: str
    quant: str | None = None
    file: str | None = None  # a path inside the repo; exclusive with quant
    revision: str | None = None  # a branch, tag or commit; None is the hub's default branch

    def __str__(self) -> str:
        tail = f"/{self.file}" if self.file else f":{self.quant}" if self.quant else ""
        return f"{PREFIX}{self.repo}{tail}"


@dataclass(frozen=True)
class HubFile:
    """One file of a repo, from the hub's listing or from a cached snapshot."""

    path: str  # inside the repo, with "/"
    size: int | None
    sha256: str | None  # the LFS sha256 (every GGUF on the hub is stored in LFS)
    git_sha1: str | None = None  # the git blob id, the only check for a file outside LFS
    local: Path | None = None  # the snapshot path, for a cached file


class _HubDown(Exception):
    """The hub did not answer (as opposed to answering "no such repo")."""


# ---------------------------------------------------------------------------------------------- references


def is_hub_ref(text: str) -> bool:
    return text.startswith(PREFIX)


def parse_hub_ref(text: str) -> HubRef | None:
    """The reference ``text`` names, None when it does not start with ``hf:``; malformed ones raise."""
    if not is_hub_ref(text):
        return None
    body = text[len(PREFIX) :]
    malformed = ModelNotFoundError(
        f"'{text}' is not a hub reference; write hf:ORG/REPO, hf:ORG/REPO:QUANT or hf:ORG/REPO/FILE.gguf"
    )
    if body.lower().endswith(".gguf"):
        parts = body.split("/")
        repo = "/".join(parts[:2])
        if len(parts) < 3 or not _REPO.fullmatch(repo) or any(p in ("", ".", "..") for p in parts[2:]):
            raise malformed
        return HubRef(repo, file="/".join(parts[2:]))
    repo, colon, quant = body.partition(":")
    if not _REPO.fullmatch(repo) or (colon and not _TAG.fullmatch(quant)):
        raise malformed
    return HubRef(repo, quant=quant or None)


# ---------------------------------------------------------------------------------------------- choosing files


def split_info(path: str) -> tuple[str, int, int]:
    """``(prefix, index, count)`` of a split GGUF's part (``model-00002-of-00003.gguf`` -> 2 of 3); a whole
    file is part 1 of 1."""
    match = _SPLIT.match(path)
    if match is None:
        return path, 1, 1
    return match["prefix"], int(match["index"]), int(match["count"])


def is_model_file(path: str) -> bool:
    """A GGUF that holds a model, not a projector, an importance matrix or a draft head."""
    name = path.rsplit("/", 1)[-1].lower()
    return name.endswith(".gguf") and not any(word in name for word in _NOT_MODELS)


def pick_files(files: Sequence[HubFile], ref: HubRef, where: str) -> list[HubFile]:
    """The files ``ref`` names among ``files`` (all parts of a split model, first part first).

    ``where`` names the listing in messages ("on the hub", "in the Hugging Face cache").
    """
    if ref.file is not None:
        primary = next((f for f in files if f.path == ref.file), None)
        if primary is None:
            raise ModelNotFoundError(f"{ref}: no file '{ref.file}' in {ref.repo} {where}{_listing(files)}")
    else:
        primary = _best_model(files, ref.quant)
        if primary is None:
            wanted = f"no model file matching '{ref.quant}'" if ref.quant else "no model file"
            raise ModelNotFoundError(f"{ref}: {wanted} in {ref.repo} {where}{_listing(files)}")
    prefix, _, count = split_info(primary.path)
    if count == 1:
        return [primary]
    parts: dict[int, HubFile] = {}
    for f in files:
        f_prefix, f_index, f_count = split_info(f.path)
        if f_prefix == prefix and f_count == count:
            parts[f_index] = f
    missing = [str(i) for i in range(1, count + 1) if i not in parts]
    if missing:
        raise ModelNotFoundError(
            f"{ref}: {prefix}.gguf is split in {count} parts but part(s) {', '.join(missing)} are not {where}"
        )
    return [parts[i] for i in range(1, count + 1)]


def _best_model(files: Sequence[HubFile], tag: str | None) -> HubFile | None:
    candidates = [f for f in files if is_model_file(f.path) and split_info(f.path)[1] == 1]
    for t in (tag,) if tag else _DEFAULT_TAGS:
        pattern = re.compile(re.escape(t) + r"[.-]", re.IGNORECASE)
        hit = next((f for f in candidates if pattern.search(f.path)), None)
        if hit is not None:
            return hit
    if tag is None and candidates:  # no tag and neither default quant: the first model file
        return candidates[0]
    return None


def _listing(files: Sequence[HubFile]) -> str:
    names = [f.path for f in files if f.path.lower().endswith(".gguf")]
    if not names:
        return " (it holds no GGUF file)"
    shown = ", ".join(names[:12]) + (f", ... ({len(names) - 12} more)" if len(names) > 12 else "")
    return f"; its GGUF files: {shown}"


# ---------------------------------------------------------------------------------------------- where and whether


def hub_endpoint() -> str:
    # Read at call time (huggingface-hub reads it once at import), so tests and callers can change it.
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, located as huggingface-hub does (read at call time)."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return Path(os.environ[variable]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "huggingface" / "hub"


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def offline_reason(endpoint: str, progress: bool, consequence: str) -> str | None:
    """Why the hub must not or cannot be asked, or None when it can.

    huggingface-hub retries a dead endpoint for ~25 s before it gives up; a plain TCP connect answers in
    milliseconds (DNS failure, refused) or a few seconds at most. ``consequence`` finishes the note printed the
    first time an endpoint is found unreachable ("falling back to ...").
    """
    if _env_true("HF_HUB_OFFLINE"):
        return "HF_HUB_OFFLINE is set"
    if endpoint in _unreachable:
        return _unreachable[endpoint]
    reason = None
    if not any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        # Behind a proxy a direct connect proves nothing; let huggingface-hub go through the proxy then.
        url = urlsplit(endpoint)
        host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
        try:
            socket.create_connection((host, port), timeout=_PROBE_TIMEOUT_S).close()
        except OSError as exc:
            reason = f"{endpoint} unreachable ({exc.strerror or exc})"
            say(f"note: the Hugging Face hub is unreachable ({endpoint}); {consequence}", progress)
    _unreachable[endpoint] = reason
    return reason


# ---------------------------------------------------------------------------------------------- entry points


def fetch_hub(ref: HubRef, *, progress: bool = True) -> Path:
    """The local path of the model ``ref`` names (the first part of a split model), downloading what is missing.

    Online, the repo's listing decides which files and what their sha256 must be; offline (or when the hub does
    not answer) the Hugging Face cache's copy of the repo does.
    """
    endpoint = hub_endpoint()
    why_offline = offline_reason(endpoint, progress, "using the Hugging Face cache")
    if why_offline is None:
        try:
            files = _remote_files(ref, endpoint)
        except _HubDown as exc:
            why_offline = str(exc)
            say(f"note: {exc}; using the Hugging Face cache", progress)
        else:
            chosen = pick_files(files, ref, "on the hub")
            paths = [_download(ref, f, endpoint, progress) for f in chosen]
            return paths[0]
    return _from_cache(ref, why_offline, progress)


def cached_hub(ref: HubRef) -> Path | None:
    """The cached model ``ref`` names if every part is in the Hugging Face cache and was checked; never hashes
    and never goes online (for listings)."""
    try:
        chosen = pick_files(_cached_files(ref), ref, "in the Hugging Face cache")
    except ModelNotFoundError:
        return None
    for f in chosen:
        digest = _expected(f)
        if f.local is None or digest is None or not _is_recorded(f.local.resolve(), digest):
            return None
    return chosen[0].local


def verify_hub(ref: HubRef, *, progress: bool = True) -> bool | None:
    """Re-hash the cached files of ``ref`` against their digests: True if all match, False if not, None if the
    Hugging Face cache has no copy. A file that fails loses its record, so the next use checks it again."""
    try:
        chosen = pick_files(_cached_files(ref), ref, "in the Hugging Face cache")
    except ModelNotFoundError:
        return None
    ok = True
    for f in chosen:
        assert f.local is not None
        blob = f.local.resolve()
        digest = _expected(f)
        got = _digest(blob, f, progress) if digest is not None else None
        if got is not None and got == digest:
            _record(blob, digest)
        else:
            ok = False
            if digest is not None:
                _record_path(digest).unlink(missing_ok=True)
    return ok


# ---------------------------------------------------------------------------------------------- online


def _remote_files(ref: HubRef, endpoint: str) -> list[HubFile]:
    from huggingface_hub import HfApi  # lazy: ~0.5 s of imports nobody needs on a cache hit
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
    from huggingface_hub.hf_api import RepoFile

    try:
        entries = list(HfApi(endpoint=endpoint).list_repo_tree(ref.repo, recursive=True, revision=ref.revision))
    except GatedRepoError:
        raise ModelNotFoundError(
            f"{ref}: {ref.repo} is gated; accept its terms on the hub and set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise ModelNotFoundError(
            f"{ref}: no repo {ref.repo} on the hub (a private one needs HF_TOKEN)"
        ) from None
    except RevisionNotFoundError:
        raise ModelNotFoundError(f"{ref}: {ref.repo} has no revision '{ref.revision}'") from None
    except HfHubHTTPError as exc:
        raise _HubDown(f"the hub could not list {ref.repo} ({_first_line(exc)})") from None
    except Exception as exc:  # noqa: BLE001 - connection resets, proxies, timeouts: the hub did not answer
        raise _HubDown(f"the hub did not answer ({_first_line(exc)})") from None
    return [
        HubFile(e.path, e.size, e.lfs.sha256 if e.lfs else None, None if e.lfs else e.blob_id)
        for e in entries
        if isinstance(e, RepoFile)
    ]


def _download(ref: HubRef, f: HubFile, endpoint: str, progress: bool) -> Path:
    from huggingface_hub import hf_hub_download

    try:
        found = hf_hub_download(
            ref.repo,
            f.path,
            revision=ref.revision,
            endpoint=endpoint,
            cache_dir=str(hf_cache_dir()),
            tqdm_class=None if progress else SilentTqdm,
        )
    except OSError as exc:
        if exc.errno is not None:  # disk full, permissions: say so plainly
            raise ModelError(
                f"{ref}: cannot write {f.path} into {hf_cache_dir()}: {exc.strerror or exc}; "
                "free some space or set HF_HUB_CACHE"
            ) from None
        raise ModelNotFoundError(f"{ref}: downloading {f.path} failed ({_first_line(exc)})") from None
    except Exception as exc:  # noqa: BLE001 - huggingface-hub raises many kinds; the message says which
        raise ModelNotFoundError(f"{ref}: downloading {f.path} failed ({_first_line(exc)})") from None
    path = Path(found)
    _check(path, f, ref, progress)
    return path


# ---------------------------------------------------------------------------------------------- offline


def _from_cache(ref: HubRef, why: str | None, progress: bool) -> Path:
    files = _cached_files(ref)
    if not files:
        raise ModelNotFoundError(f"{ref}: {why}, and the Hugging Face cache ({hf_cache_dir()}) has no copy of it")
    chosen = pick_files(files, ref, f"in the Hugging Face cache ({why})")
    for f in chosen:
        assert f.local is not None
        _check(f.local, f, ref, progress)
    assert chosen[0].local is not None
    return chosen[0].local


def _repo_folder(repo: str) -> Path:
    return hf_cache_dir() / f"models--{repo.replace('/', '--')}"


def _snapshot(folder: Path, revision: str | None) -> Path | None:
    """The snapshot a revision points to: a commit directly, else through refs/ (the default branch: main)."""
    snapshots = folder / "snapshots"
    if revision is not None and _HEX40.fullmatch(revision):
        return snapshots / revision if (snapshots / revision).is_dir() else None
    try:
        commit = (folder / "refs" / (revision or "main")).read_text(encoding="utf-8").strip()
    except OSError:
        commit = ""
    if commit and (snapshots / commit).is_dir():
        return snapshots / commit
    if revision is None and snapshots.is_dir():  # no ref recorded (a copied cache): the newest snapshot
        dirs = [d for d in snapshots.iterdir() if d.is_dir()]
        return max(dirs, key=lambda d: d.stat().st_mtime) if dirs else None
    return None


def _cached_files(ref: HubRef) -> list[HubFile]:
    """The files of the snapshot ``ref`` resolves to, in path order (the hub lists in that order too)."""
    snapshot = _snapshot(_repo_folder(ref.repo), ref.revision)
    if snapshot is None:
        return []
    files = []
    for path in sorted(snapshot.rglob("*")):
        try:
            blob = path.resolve(strict=True)
            if not blob.is_file():
                continue
            size = blob.stat().st_size
        except OSError:  # a dangling link: a blob removed by hand
            continue
        # A blob is named after the file's ETag: the sha256 for LFS files, the git blob id for the others.
        sha256 = blob.name if _HEX64.fullmatch(blob.name) else None
        sha1 = blob.name if _HEX40.fullmatch(blob.name) else None
        files.append(HubFile(path.relative_to(snapshot).as_posix(), size, sha256, sha1, local=path))
    return files


# ---------------------------------------------------------------------------------------------- checking


def _expected(f: HubFile) -> str | None:
    return f.sha256 or f.git_sha1


def _digest(blob: Path, f: HubFile, progress: bool) -> str:
    if f.sha256 is not None:
        return hash_file(blob, progress, f"checking {f.path.rsplit('/', 1)[-1]}")
    # Outside LFS the hub gives the git blob id: sha1 of "blob <size>\0" and the bytes (small files only).
    hasher = hashlib.sha1(f"blob {blob.stat().st_size}\0".encode())
    hasher.update(blob.read_bytes())
    return hasher.hexdigest()


def _check(pointer: Path, f: HubFile, ref: HubRef, progress: bool) -> None:
    """Raise unless the file behind ``pointer`` is the one the listing describes; a bad download is removed."""
    blob = pointer.resolve()
    size = blob.stat().st_size
    if f.size is not None and size != f.size:
        _discard(pointer, blob)
        raise ModelError(
            f"{ref}: {f.path} is {size} bytes but the hub lists {f.size}; removed it, run the command again"
        )
    digest = _expected(f)
    if digest is None or _is_recorded(blob, digest):
        return
    got = _digest(blob, f, progress)
    if got != digest:
        _discard(pointer, blob)
        what = "sha256" if f.sha256 else "git blob id"
        raise ModelError(
            f"{ref}: {f.path} has {what} {got[:16]}... but the hub records {digest[:16]}...; "
            "removed it from the Hugging Face cache, run the command again to download it afresh"
        )
    _record(blob, digest)


def _discard(pointer: Path, blob: Path) -> None:
    # Only ever inside the Hugging Face cache: a file a user named by path is never deleted.
    root = hf_cache_dir().resolve()
    for path in (pointer, blob):
        if path.absolute().is_relative_to(root) or path.resolve().is_relative_to(root):
            path.unlink(missing_ok=True)


def _record_path(digest: str) -> Path:
    return model_cache_dir() / ".hub-verified" / digest


def _is_recorded(blob: Path, digest: str) -> bool:
    try:
        recorded = _record_path(digest).read_text(encoding="utf-8").split("\t")
        st = blob.stat()
    except OSError:
        return False
    return recorded == [str(st.st_size), str(st.st_mtime_ns), str(blob)]


def _record(blob: Path, digest: str) -> None:
    """Remember that ``blob`` (as it is now: size, mtime) has ``digest``. Best effort: an unwritable edgespec
    cache only means the next run hashes again."""
    path = _record_path(digest)
    st = blob.stat()
    tmp = path.with_name(f".{digest}.{os.getpid()}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(f"{st.st_size}\t{st.st_mtime_ns}\t{blob}", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
