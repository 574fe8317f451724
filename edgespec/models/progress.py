"""What fetching shows the user: progress bars and notes on stderr, and hashing a file with a bar."""

from __future__ import annotations

import hashlib
import logging
import sys
from pathlib import Path

from tqdm import tqdm

__all__ = ["SilentTqdm", "bar", "hash_file", "say"]

log = logging.getLogger("edgespec.models")

CHUNK = 1 << 20


def bar(progress: bool, total: int, desc: str) -> tqdm:
    """A byte-counting bar on stderr that vanishes when done (or a no-op one when ``progress`` is False)."""
    return tqdm(
        total=total,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        disable=not progress,
        leave=False,
    )


class SilentTqdm(tqdm):
    """For libraries that take a tqdm class (huggingface-hub): the same bar, never shown."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - tqdm's own signature
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)


def hash_file(path: Path, progress: bool, desc: str, algorithm: str = "sha256") -> str:
    """The hex digest of a whole file, read in 1 MiB chunks under a progress bar."""
    hasher = hashlib.new(algorithm)
    with open(path, "rb") as src, bar(progress, path.stat().st_size, desc) as shown:
        while chunk := src.read(CHUNK):
            hasher.update(chunk)
            shown.update(len(chunk))
    return hasher.hexdigest()


def say(message: str, progress: bool) -> None:
    """A note for the user: logged, and printed to stderr when progress is shown."""
    # info, not warning: with no logging configured Python prints warnings itself, and this would show twice.
    log.info(message)
    if progress:
        print(message, file=sys.stderr, flush=True)
