"""Drafters propose tokens for the target to verify. See :mod:`edgespec.drafters.base` for the protocol."""

from edgespec.drafters.base import Draft, Drafter

__all__ = ["Draft", "Drafter"]
