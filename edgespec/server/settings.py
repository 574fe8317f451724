"""What the command line decides about the server (not about the models)."""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass, field

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024  # a 128k-token conversation is ~0.5 MB of text; JSON escaping adds little
RETRY_AFTER_SECONDS = 2  # what a 503 (queue full, still loading) tells clients; the openai client honours it


@dataclass(frozen=True)
class ServerSettings:
    alias: str | None = None  # the model id clients see (default: the target's name)
    api_key: str | None = None  # required (Bearer or X-Api-Key) on every route but /health when set
    api_keys: tuple[str, ...] = ()  # more keys, each as good as api_key (each a scope of its own; see below)
    max_queue: int = 8  # requests that may wait behind the running one; more get a 503
    cors_origins: tuple[str, ...] = field(default_factory=tuple)  # none: no CORS headers at all
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # What a request drafts from besides its own text (edgespec.api.SUFFIX_CACHE_MODES): "key", the earlier replies
    # to requests with the same API key (a reply's speed then reveals nothing of another client's); "global", every
    # earlier reply; "off". None: "key" when keys are required, "global" when none are.
    suffix_cache: str | None = None

    def __post_init__(self) -> None:
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if any(not key for key in self.keys) or (self.api_key is not None and not self.api_key):
            raise ValueError("the API key must not be empty")
        if self.suffix_cache not in (None, "key", "global", "off"):
            raise ValueError(f"suffix_cache must be key, global or off, got {self.suffix_cache!r}")
        if self.suffix_cache == "key" and not self.keys:
            raise ValueError("a suffix cache scoped by API key needs API keys")

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key a request may send (none: no key is required)."""
        return ((self.api_key,) if self.api_key else ()) + self.api_keys

    @property
    def cache_mode(self) -> str:
        return self.suffix_cache or ("key" if self.keys else "global")


def key_identity(key: bytes) -> str:
    """What names an API key in the suffix cache (its scope there, and in a saved cache): a hash, not the key."""
    return hashlib.sha256(key).hexdigest()[:16]


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server reachable from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to anything
