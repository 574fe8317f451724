"""Errors a user can act on. Each carries a one-line message fit for a CLI or a TUI status line."""

from __future__ import annotations


class EdgespecError(Exception):
    """Base of every error edgespec raises on purpose (bad input, missing model, ...)."""


class InvalidParameterError(EdgespecError, ValueError):
    """A sampling or engine parameter is out of range."""


class ModelError(EdgespecError):
    """A model file is missing, unreadable, not GGUF, or corrupt."""


class ModelNotFoundError(ModelError):
    """A model reference is neither a path nor a known registry name, or no source could provide it."""


class VocabMismatchError(EdgespecError):
    """Target and draft do not share a tokenizer, so draft tokens would mean something else to the target."""


class ContextOverflowError(EdgespecError):
    """The prompt plus the requested tokens (plus the draft headroom) do not fit in the context window."""


class RegistryError(EdgespecError):
    """models.toml (shipped or user override) is malformed."""
