"""What the command line decides about the server (not about the models)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024  # a 128k-token conversation is ~0.5 MB of text; JSON escaping adds little
RETRY_AFTER_SECONDS = 2  # what a 503 (queue full, still loading) tells clients; the openai client honours it


@dataclass(frozen=True)
class ServerSettings:
    alias: str | None = None  # the model id clients see (default: the target's name)
    api_key: str | None = None  # required (Bearer or X-Api-Key) on every route but /health when set
    max_queue: int = 8  # requests that may wait behind the running one; more get a 503
    cors_origins: tuple[str, ...] = field(default_factory=tuple)  # none: no CORS headers at all
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    def __post_init__(self) -> None:
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("the API key must not be empty")


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server reachable from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to anything
