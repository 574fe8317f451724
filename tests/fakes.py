"""A fake llama.cpp model: logits are a deterministic function of the token prefix, so the engine's bookkeeping
(KV positions, rollback, pending tokens, stops) can be tested in milliseconds and the exact output distribution
is computable. :class:`FakeModel` offers all of :class:`~edgespec.models.slot.KVModel`, :class:`FakeSlot` all of
:class:`~edgespec.models.slot.KVSlot`, as the real Model and Slot do."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from edgespec.models.slot import MAX_ROWS, sync
from edgespec.sampling import LOGITS, Candidates, Readout, Scores

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
        n_seq: int = 1,
        delay: float = 0.0,
    ) -> None:
        self.n_vocab = n_vocab
        self.n_ctx = n_ctx
        self.n_batch = n_ctx  # every decode in one batch
        self.seed = seed
        self.noise = noise
        self.sharp = sharp
        self.eos_bias = eos_bias
        self.kv_tokens: list[int] = []
        self._rows: dict[tuple, tuple[np.ndarray, list[int], list[float]]] = {}  # by key: see _row
        self.busy_seconds = 0.0
        self.decode_calls: list[tuple[int, int]] = []  # (n_tokens, n_logit_rows) of each decode
        self.readouts: list[Readout] = []  # the readout of each decode
        self.name = f"fake-{seed}"
        self.path = self.name
        self.n_gpu_layers = 0
        self.rpc: tuple[str, ...] = ()  # no layers on an RPC server
        self.delay = delay  # seconds each decode sleeps (releasing the GIL, as llama_decode does)
        self.description = f"fake {n_vocab}-token model"
        self.placement = "CPU"
        self.bit_exact = False
        self.max_verify_rows = MAX_ROWS  # a test may narrow it, as a bit-exact Model has it
        self.n_params = 0
        # Sequences as the real Model has them: slot 0 is the model itself, the others share its rows
        self.slots = [self] + [FakeSlot(self, i) for i in range(1, n_seq)]
        self.batches: list[list[int]] = []  # the rows of each part of each batched decode
        self.copies: list[tuple[int, int, int]] = []  # (from, to, cells) of each KV prefix copied
        self.seq_id = 0

    @property
    def n_seq(self) -> int:
        return len(self.slots)

    def decode_batch(self, parts) -> list[Scores]:
        """Each part decoded on its own sequence (rows depend on the prefix only); the batch is recorded."""
        self.batches.append([len(rows) for _, _, rows, _ in parts])
        return [slot.decode(tokens, rows, readout) for slot, tokens, rows, readout in parts]

    def decode_passes(self, tokens_by_seq) -> list[int]:
        """One forward pass for every batched decode (the fake has no micro-batches)."""
        return [sum(tokens_by_seq.values())]

    sync = sync  # the real prefix-reuse logic, on the fake's decode/truncate

    def logits_after(self, prefix: Sequence[int]) -> np.ndarray:
        """Next-token logits given the whole prefix (depends on the last two tokens and the length's parity)."""
        return self._row(prefix)[0]

    def _row(self, prefix: Sequence[int]) -> tuple[np.ndarray, list[int], list[float]]:
        """The logits after ``prefix``, and its token ids best first with their logits as Python floats: cached by
        the key the logits depend on (the statistical tests ask for millions of rows)."""
        key = (tuple(prefix[-2:]), len(prefix) % 2)
        known = self._rows.get(key)
        if known is not None:
            return known
        rng = np.random.default_rng(abs(hash(key)) % (2**32))
        x = rng.normal(size=self.n_vocab) * self.sharp
        if self.noise:
            x = (
                x
                + np.random.default_rng(abs(hash((key, self.seed))) % (2**32)).normal(size=self.n_vocab)
                * self.noise
            )
        x[EOS] += self.eos_bias
        x = x.astype(np.float32)
        x.flags.writeable = False  # shared by every call with this key
        ranked = np.argsort(-x, kind="stable").tolist()
        self._rows[key] = row = (x, ranked, [float(x[t]) for t in ranked])
        return row

    def decode(self, tokens: Sequence[int], rows: Sequence[int] = (), readout: Readout = LOGITS) -> Scores:
        return self._decode_on(self, tokens, rows, readout)

    def _decode_on(self, seq, tokens: Sequence[int], rows: Sequence[int], readout: Readout) -> Scores:
        """The real Model's contract: scores of ``rows`` as ``readout`` asks (top-k candidates in no particular
        order, as llama.cpp's in-graph top-k leaves them: here rotated by a step that changes every decode)."""
        if len(seq.kv_tokens) + len(tokens) > self.n_ctx:
            raise AssertionError("fake context overflow")
        if self.delay:
            time.sleep(self.delay)
        start = list(seq.kv_tokens)
        scored = [self._row(start + list(tokens[: i + 1])) for i in rows]
        seq.kv_tokens.extend(tokens)
        self.decode_calls.append((len(tokens), len(scored)))
        self.readouts.append(readout)
        if readout.kind == "argmax":
            return [ranked[0] for _, ranked, _ in scored]
        if readout.kind == "top_k":  # lists, as the real Model reads them out
            k = readout.k
            turn = len(self.decode_calls) % k
            ids = [ranked[:k][turn:] + ranked[:k][:turn] for _, ranked, _ in scored]
            values = [values[:k][turn:] + values[:k][:turn] for _, _, values in scored]
            log_z = None
            if readout.log_norm:  # the normaliser over the whole row, as llama.cpp's graph computes it
                log_z = [float(np.logaddexp.reduce(np.asarray(x, dtype=np.float64))) for x, _, _ in scored]
            return Candidates(ids, values, log_z)
        return np.array([x for x, _, _ in scored], dtype=np.float32).reshape(len(scored), self.n_vocab)

    def readout_path(self, readout: Readout) -> str:
        return readout.path

    def rehearse(self, tokens: Sequence[int], rows: Sequence[int], readout: Readout, start: int) -> None:
        """The real Model's checks and batch filling (a replay runs them); the fake has no batch to fill."""

    def truncate(self, n_keep: int) -> None:
        del self.kv_tokens[n_keep:]

    def copy_prefix_from(self, source, n: int) -> None:
        self.kv_tokens = list(source.kv_tokens[:n])
        self.copies.append((source.seq_id, 0, n))

    def close(self) -> None:
        """Nothing to free (a Runtime closes its models)."""

    def tokenize(self, text: str, **_: object) -> list[int]:
        return [1 + (ord(c) - ord("a")) % (self.n_vocab - 1) for c in text]

    def piece(self, token: int) -> bytes:
        return b"" if token == EOS else chr(ord("a") + token % 26).encode()

    def is_eog(self, token: int) -> bool:
        return token == EOS

    def token_text(self, token: int) -> str:
        return "</s>" if token == EOS else self.piece(token).decode()


class FakeSlot:
    """Sequence ``seq_id`` of a :class:`FakeModel`: its own KV, the model's rows."""

    def __init__(self, model: FakeModel, seq_id: int) -> None:
        self.model = model
        self.seq_id = seq_id
        self.kv_tokens: list[int] = []

    def decode(self, tokens: Sequence[int], rows: Sequence[int] = (), readout: Readout = LOGITS) -> Scores:
        return self.model._decode_on(self, tokens, rows, readout)

    def truncate(self, n_keep: int) -> None:
        del self.kv_tokens[n_keep:]

    def copy_prefix_from(self, source, n: int) -> None:
        self.kv_tokens = list(source.kv_tokens[:n])
        self.model.copies.append((source.seq_id, self.seq_id, n))

    sync = sync

    def __getattr__(self, name: str):
        return getattr(self.model, name)
