"""Where edgespec keeps files: an EDGESPEC_* variable when set (tests, portable installs), else the XDG location."""

from __future__ import annotations

import os
from pathlib import Path


def user_path(override: str, xdg: str, xdg_default: str, *parts: str) -> Path:
    """``$override`` as is when set, else ``$xdg`` (default ``~/xdg_default``) joined with ``parts``."""
    explicit = os.environ.get(override)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get(xdg) or str(Path.home() / xdg_default)
    return Path(base).expanduser().joinpath(*parts)


def model_cache_dir() -> Path:
    """Where edgespec keeps fetched models: ``$EDGESPEC_CACHE``, else ``$XDG_CACHE_HOME/edgespec/models``."""
    return user_path("EDGESPEC_CACHE", "XDG_CACHE_HOME", ".cache", "edgespec", "models")


def state_dir() -> Path:
    """Where edgespec keeps what it measured or worked out about this machine's files (decode costs, vocabulary
    fingerprints): ``$EDGESPEC_STATE`` when set, else the model cache. Apart from the models, so that a test run,
    which reads the user's models, can keep its own (its costs are taken on a machine busy with tests)."""
    explicit = os.environ.get("EDGESPEC_STATE")
    return Path(explicit).expanduser() if explicit else model_cache_dir()


def cost_cache_path() -> Path:
    """The measured decode costs."""
    return state_dir() / ".costs.json"
