"""Whether a draft can draft for a target, from GGUF metadata alone (no weights loaded).

llama.cpp (``common_speculative_are_compatible`` in common/speculative.cpp) refuses a draft unless both
models have the same vocabulary type; the same add-BOS and add-EOS behaviour and, where a token is added, the
same id for it; vocabulary sizes within 128; and identical token texts from id 5 on. When a GGUF does not say
whether it adds BOS/EOS, llama.cpp's vocabulary loader (src/llama-vocab.cpp) decides by tokenizer, and so does
this module (:func:`incompatibility`). :func:`check_vocab_compatible`, which ``load`` runs, also wants the BOS and
EOS ids equal and the tokenizer models named alike; a draft counts as compatible here only when it passes both, so
a draft chosen here is never refused at load time. Both work from metadata alone, so an incompatible pair fails in
milliseconds instead of after loading two sets of weights.

A vocabulary's *fingerprint* is a hash of its tokenizer and its token texts: equal fingerprints mean identical
vocabularies, which settles most comparisons without reading two token lists.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from gguf import TokenType

from edgespec.errors import VocabMismatchError
from edgespec.models.gguf import GGUFInfo, read_vocab, token_array_bytes

__all__ = [
    "FIRST_COMPARED_TOKEN", "VOCAB_SIZE_MARGIN", "VocabFacts", "check_vocab_compatible", "fingerprint",
    "incompatibility", "vocab_facts",
]  # fmt: skip

FIRST_COMPARED_TOKEN = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID
# llama.cpp's speculative example accepts target/draft vocabularies whose sizes differ by at most this much
# (the tail is padding or extra special tokens the draft never proposes).
VOCAB_SIZE_MARGIN = 128

# tokenizer.ggml.model -> llama.cpp's vocabulary type
_VOCAB_TYPES = {
    "no_vocab": "none", "none": "none", "llama": "spm", "bert": "wpm", "gpt2": "bpe", "gemma4": "bpe",
    "t5": "ugm", "rwkv": "rwkv", "plamo2": "plamo2",
}  # fmt: skip
# BPE pre-tokenizers for which llama.cpp adds BOS unless the file says otherwise.
_BPE_PRE_ADDING_BOS = {
    "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano",
    "tekken", "chameleon", "gemma4",
}  # fmt: skip
# Token types that are text a model can emit as ordinary output; the rest (control, user-defined, unknown,
# unused) are specials that may legitimately differ between siblings.
_PLAIN_TOKEN_TYPES = {int(TokenType.NORMAL), int(TokenType.BYTE)}


@dataclass(frozen=True)
class VocabFacts:
    """What llama.cpp compares, with its defaults applied."""

    tokenizer: str | None  # tokenizer.ggml.model as written
    vocab_type: str | None  # llama.cpp's type for it; None for one it does not know
    add_bos: bool
    add_eos: bool
    bos_id: int | None
    eos_id: int | None
    n_vocab: int


def vocab_facts(info: GGUFInfo) -> VocabFacts:
    vocab_type = _VOCAB_TYPES.get(info.tokenizer_model or "")
    add_bos, add_eos = _default_add_bos_eos(vocab_type, info.tokenizer_pre)
    if info.add_bos is not None:
        add_bos = info.add_bos
    if info.add_eos is not None:
        add_eos = info.add_eos
    if info.tokenizer_model == "gemma4" or info.tokenizer_pre == "gemma4":
        add_bos = True  # llama.cpp overrides the file for Gemma 4
    return VocabFacts(info.tokenizer_model, vocab_type, add_bos, add_eos, info.bos_id, info.eos_id, info.n_vocab)


def _default_add_bos_eos(vocab_type: str | None, pre: str | None) -> tuple[bool, bool]:
    if vocab_type in ("spm", "wpm"):
        return True, False
    if vocab_type == "ugm":
        return False, True
    if vocab_type == "bpe":
        return (pre or "") in _BPE_PRE_ADDING_BOS, False
    return False, False


def fingerprint(info: GGUFInfo) -> str:
    """A short hash of the tokenizer and every token text, in id order (reads the token list, no weights)."""
    texts, _ = read_vocab(info)
    hasher = hashlib.sha256(f"{info.tokenizer_model}\0{len(texts)}\0".encode())
    hasher.update(struct.pack(f"<{len(texts)}I", *map(len, texts)))
    hasher.update(b"".join(texts))
    return hasher.hexdigest()[:16]


def incompatibility(
    target: GGUFInfo, draft: GGUFInfo, *, fingerprints: tuple[str, str] | None = None
) -> str | None:
    """Why ``draft`` cannot draft for ``target``, or None when it can.

    ``fingerprints`` (target's, draft's), when known, spare reading both token lists for identical vocabularies.
    """
    t, d = vocab_facts(target), vocab_facts(draft)
    if t.tokenizer != d.tokenizer:
        return f"another tokenizer ({d.tokenizer} vs the target's {t.tokenizer})"
    if t.vocab_type is None:
        return f"a tokenizer llama.cpp does not know ({t.tokenizer})"
    for what, add_t, add_d, id_t, id_d in (
        ("BOS", t.add_bos, d.add_bos, t.bos_id, d.bos_id),
        ("EOS", t.add_eos, d.add_eos, t.eos_id, d.eos_id),
    ):
        if add_t != add_d:
            return (
                f"it {'adds' if add_d else 'does not add'} {what} to a prompt "
                f"and the target {'does not' if add_d else 'does'}"
            )
        if id_t != id_d:
            return f"another {what} id ({id_d} vs the target's {id_t})"
    if abs(t.n_vocab - d.n_vocab) > VOCAB_SIZE_MARGIN:
        return f"{d.n_vocab} tokens vs the target's {t.n_vocab} (more than {VOCAB_SIZE_MARGIN} apart)"
    if fingerprints is not None and fingerprints[0] == fingerprints[1]:
        return None
    return _text_difference(target, draft)


def check_vocab_compatible(target: GGUFInfo, draft: GGUFInfo) -> None:
    """Raise :class:`VocabMismatchError` unless the draft's token ids mean the same text to the target.

    Same rules as llama.cpp's speculative decoding: same tokenizer model type, same BOS/EOS ids, vocabulary
    sizes within :data:`VOCAB_SIZE_MARGIN`, and identical token texts over the shared id range (specials
    excepted). Works from metadata only, before any weights are loaded.
    """
    t, d = target.label(), draft.label()
    advice = "pick a draft from the target's model family"
    if target.tokenizer_model != draft.tokenizer_model:
        raise VocabMismatchError(
            f"target {t} uses tokenizer '{target.tokenizer_model}' but draft {d} uses "
            f"'{draft.tokenizer_model}'; {advice}"
        )
    for what, a, b in (("BOS", target.bos_id, draft.bos_id), ("EOS", target.eos_id, draft.eos_id)):
        if a != b:
            raise VocabMismatchError(f"target {t} has {what} id {a} but draft {d} has {b}; {advice}")
    if abs(target.n_vocab - draft.n_vocab) > VOCAB_SIZE_MARGIN:
        raise VocabMismatchError(
            f"target {t} has {target.n_vocab} tokens but draft {d} has {draft.n_vocab} "
            f"(more than {VOCAB_SIZE_MARGIN} apart); {advice}"
        )
    # Siblings: one vocabulary, byte for byte, compared in C.
    if token_array_bytes(target) == token_array_bytes(draft):
        return
    t_texts, t_types = read_vocab(target)
    d_texts, d_types = read_vocab(draft)
    shared = min(len(t_texts), len(d_texts))
    if t_texts[:shared] == d_texts[:shared]:  # the common case, compared at C speed
        return
    for i in range(shared):
        if t_texts[i] == d_texts[i]:
            continue
        if (t_types and t_types[i] not in _PLAIN_TOKEN_TYPES) or (
            d_types and d_types[i] not in _PLAIN_TOKEN_TYPES
        ):
            continue
        raise VocabMismatchError(
            f"target {t} and draft {d} differ at token {i}: "
            f"{_show(t_texts[i])} vs {_show(d_texts[i])}; {advice}"
        )


def _text_difference(target: GGUFInfo, draft: GGUFInfo) -> str | None:
    t_texts, t_types = read_vocab(target)
    d_texts, d_types = read_vocab(draft)
    shared = min(len(t_texts), len(d_texts))
    if t_texts[:shared] == d_texts[:shared]:  # the common case, compared at C speed
        return None
    for i in range(shared):
        if t_texts[i] == d_texts[i]:
            continue
        # Below id 5 llama.cpp looks at nothing, and edgespec's own check forgives special tokens.
        special = (t_types is not None and t_types[i] not in _PLAIN_TOKEN_TYPES) or (
            d_types is not None and d_types[i] not in _PLAIN_TOKEN_TYPES
        )
        if i < FIRST_COMPARED_TOKEN and special:
            continue
        return f"token {i} differs ({_show(d_texts[i])} vs the target's {_show(t_texts[i])})"
    return None


def _show(token: bytes) -> str:
    # repr() keeps the message on one line whatever the token holds (newlines, control bytes).
    return repr(token.decode("utf-8", errors="replace"))
