"""A fake llama.cpp model: logits are a deterministic function of the token prefix, so the engine's bookkeeping
(KV positions, rollback, pending tokens, stops) can be tested in milliseconds and the exact output distribution
is computable."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgespec.models.backend import Model

EOS = 0


class FakeModel:
    """Tokens 0..n_vocab-1; token 0 is end-of-generation; token t's text is ``chr(ord('a') + t % 26)``."""

    def __init__(
        self,
        n_vocab: int = 12,
        *,
        seed: int = 0,
        noise: float = 0.0,
        n_ctx: int = 256,
        sharp: float = 2.0,
        eos_bias: float = -4.0,
    ) -> None:
        self.n_vocab = n_vocab
        self.n_ctx = n_ctx
        self.seed = seed
        self.noise = noise
        self.sharp = sharp
        self.eos_bias = eos_bias
        self.kv_tokens: list[int] = []
        self.busy_seconds = 0.0
        self.decode_calls: list[tuple[int, int]] = []  # (n_tokens, n_logit_rows) of each decode
        self.name = f"fake-{seed}"
        self.path = self.name
        self.n_gpu_layers = 0

    sync = Model.sync  # the real prefix-reuse logic, on the fake's decode/truncate

    def logits_after(self, prefix: Sequence[int]) -> np.ndarray:
        """Next-token logits given the whole prefix (depends on the last two tokens and the length's parity)."""
        key = (tuple(prefix[-2:]), len(prefix) % 2)
        rng = np.random.default_rng(abs(hash(key)) % (2**32))
        x = rng.normal(size=self.n_vocab) * self.sharp
        if self.noise:
            x = (
                x
                + np.random.default_rng(abs(hash((key, self.seed))) % (2**32)).normal(size=self.n_vocab)
                * self.noise
            )
        x[EOS] += self.eos_bias
        return x.astype(np.float32)

    def decode(self, tokens: Sequence[int], logits_at: Sequence[int] = (), *, argmax: bool = False) -> np.ndarray:
        if len(self.kv_tokens) + len(tokens) > self.n_ctx:
            raise AssertionError("fake context overflow")
        start = list(self.kv_tokens)
        rows = [self.logits_after(start + list(tokens[: i + 1])) for i in logits_at]
        self.kv_tokens.extend(tokens)
        self.decode_calls.append((len(tokens), len(rows)))
        out = np.array(rows, dtype=np.float32).reshape(len(rows), self.n_vocab)
        return out.argmax(axis=1) if argmax else out

    def truncate(self, n_keep: int) -> None:
        del self.kv_tokens[n_keep:]

    def tokenize(self, text: str, **_: object) -> list[int]:
        return [1 + (ord(c) - ord("a")) % (self.n_vocab - 1) for c in text]

    def piece(self, token: int) -> bytes:
        return b"" if token == EOS else chr(ord("a") + token % 26).encode()

    def is_eog(self, token: int) -> bool:
        return token == EOS

    def token_text(self, token: int) -> str:
        return "</s>" if token == EOS else self.piece(token).decode()
