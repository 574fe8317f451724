"""What llama.cpp requires of a GGUF file's metadata, checked before it loads the file.

llama.cpp reads most keys with a type check that fails cleanly, but it trusts their values: a layer count of 0,
more experts in use than exist, an unknown RoPE scaling type or two tokens with the same text each end in a
``GGML_ASSERT`` and an abort. The rules here are read from the llama.cpp that llama-cpp-python 0.3.36 vendors:
``llama_model_base::load_hparams`` (keys every architecture needs), each architecture's ``load_arch_hparams``
(ours: llama, qwen2, gemma3) and ``llama_vocab::impl::load`` (the vocabulary).

Each broken rule raises :class:`Corrupt` with a message that starts with the field it is about.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

# GGUF value types (gguf_type in ggml's gguf.h) and the names llama.cpp's messages use for them.
STRING, ARRAY = 8, 9
TYPE_NAMES = {
    0: "u8", 1: "i8", 2: "u16", 3: "i16", 4: "u32", 5: "i32", 6: "f32", 7: "bool", 8: "string", 9: "array",
    10: "u64", 11: "i64", 12: "f64",
}  # fmt: skip
_U32, _I32, _F32, _BOOL = 4, 5, 6, 7
_INTEGER_TYPES = {0, 1, 2, 3, 4, 5, 10, 11}
_FLOAT_TYPES = {6, 12}

_MAX_LAYERS = 512  # LLAMA_MAX_LAYERS
_MAX_EXPERTS = 1024  # LLAMA_MAX_EXPERTS
_ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")  # llama_rope_scaling_type_from_string

# How llama.cpp reads a key: "u32", "f32", "bool", "string" (get_key<T>: exactly that GGUF type), or "per-layer"
# (get_key_or_arr: a u32, or an array of u32/i32 with one item per layer).
_ARCH_KEYS = {
    "context_length": "u32",
    "embedding_length": "u32",
    "block_count": "u32",
    "vocab_size": "u32",
    "feed_forward_length": "per-layer",
    "attention.head_count": "per-layer",
    "attention.head_count_kv": "per-layer",
    "attention.key_length": "u32",
    "attention.value_length": "u32",
    "attention.layer_norm_rms_epsilon": "f32",
    "attention.layer_norm_epsilon": "f32",
    "attention.sliding_window": "u32",
    "attention.causal": "bool",
    "expert_count": "u32",
    "expert_used_count": "per-layer",
    "expert_group_count": "u32",
    "expert_group_used_count": "u32",
    "nextn_predict_layers": "u32",
    "rope.dimension_count": "u32",
    "rope.freq_base": "f32",
    "rope.scaling.type": "string",
    "rope.scaling.factor": "f32",
    "rope.scaling.original_context_length": "u32",
    "rope.scaling.finetuned": "bool",
    "final_logit_softcapping": "f32",
    "attn_logit_softcapping": "f32",
}
# llama_model_base::load_hparams reads these with required=true, for every architecture.
_REQUIRED_ARCH_KEYS = ("context_length", "embedding_length", "block_count")
# The architectures edgespec ships models for: load_arch_hparams requires the RMS-norm epsilon, and all three size
# their attention heads from the head count (an absent one leaves llama.cpp dividing by zero in places).
_REQUIRED_BY_ARCH = {
    arch: ("attention.layer_norm_rms_epsilon", "attention.head_count") for arch in ("llama", "qwen2", "gemma3")
}

_TOKENIZER_KEYS = {
    "tokenizer.ggml.model": "string",
    "tokenizer.ggml.pre": "string",
    "tokenizer.ggml.token_type_count": "u32",
    "tokenizer.ggml.add_bos_token": "bool",
    "tokenizer.ggml.add_eos_token": "bool",
    "tokenizer.ggml.add_sep_token": "bool",
    "tokenizer.ggml.add_space_prefix": "bool",
    "tokenizer.ggml.remove_extra_whitespaces": "bool",
    "general.architecture": "string",
    "general.name": "string",
}
# Tokenizer models whose vocabulary loader requires the BPE merges (llama_vocab::impl::load).
_NEEDS_MERGES = ("gpt2", "gemma4", "hybriddna", "whitespace")


class Corrupt(Exception):
    """The bytes do not make a file llama.cpp can load safely. Turned into a ModelError naming the file."""


class Truncated(Corrupt):
    """The file ends before the structure it describes does."""


def show(text: str | bytes, limit: int = 60) -> str:
    """A key, name or token for a one-line message: quoted, escaped, cut short."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if len(text) > limit:
        text = text[:limit] + "…"
    return repr(text)


class Meta:
    """The metadata as (GGUF type, value) per key; arrays are left where they lie in the file (they have
    ``count`` and ``etype``)."""

    def __init__(self, values: Mapping[str, tuple[int, Any]]) -> None:
        self._values = values

    def __contains__(self, key: str) -> bool:
        return key in self._values

    def value(self, key: str) -> Any:
        entry = self._values.get(key)
        return entry[1] if entry else None

    def type(self, key: str) -> int | None:
        entry = self._values.get(key)
        return entry[0] if entry else None

    def str(self, key: str) -> str | None:
        return self.value(key) if self.type(key) == STRING else None

    def int(self, key: str) -> int | None:
        return self.value(key) if self.type(key) in _INTEGER_TYPES else None

    def keys(self) -> list[str]:
        return list(self._values)

    def expect(self, key: str, kind: str, n_layers: int = 0) -> None:
        """Raise unless ``key`` has the type llama.cpp reads it as (see ``_ARCH_KEYS`` for the kinds)."""
        vtype = self.type(key)
        if kind == "per-layer" and vtype == ARRAY:
            ref = self.value(key)
            if ref.etype not in (_U32, _I32):
                got = TYPE_NAMES.get(ref.etype, ref.etype)
                raise bad_key(key, f"is an array of {got}; llama.cpp reads u32 or i32 items")
            if ref.count != n_layers:
                raise bad_key(key, f"has {ref.count} items but the model has {n_layers} layers")
            return
        wanted = {"u32": _U32, "f32": _F32, "bool": _BOOL, "string": STRING, "per-layer": _U32}[kind]
        if vtype != wanted:
            got = "missing" if vtype is None else _article(TYPE_NAMES.get(vtype, str(vtype)))
            need = "u32 or an array of one per layer" if kind == "per-layer" else TYPE_NAMES[wanted]
            raise bad_key(key, f"is {got}; llama.cpp reads it as {need}")


def bad_key(key: str, problem: str) -> Corrupt:
    """The error for a metadata value llama.cpp cannot use: names the key, then says what is wrong."""
    return Corrupt(f"metadata key {show(key)} {problem}")


def _article(type_name: str) -> str:
    return f"{'an' if type_name[0] in 'aif' else 'a'} {type_name}"  # an i32, an f32, an array; a u32, a string


def check_metadata(meta: Meta, token_texts: list[bytes] | None) -> None:
    """Every rule below: the general and tokenizer keys' types, the architecture, the vocabulary."""
    for key, kind in _TOKENIZER_KEYS.items():
        if key in meta:
            meta.expect(key, kind)
    arch = meta.str("general.architecture")
    if not arch:
        raise bad_key("general.architecture", "is missing, so llama.cpp cannot tell what model this is")
    check_architecture(meta, arch)
    check_vocabulary(meta, token_texts)


# ---------------------------------------------------------------------------------------------- architecture


def check_architecture(meta: Meta, arch: str) -> None:
    """The hyperparameters llama.cpp reads for ``arch``: present, of the right type, and values its asserts allow."""

    def key(suffix: str) -> str:
        return f"{arch}.{suffix}"

    for suffix in (*_REQUIRED_ARCH_KEYS, *_REQUIRED_BY_ARCH.get(arch, ())):
        if key(suffix) not in meta:
            raise bad_key(key(suffix), f"is missing; llama.cpp requires it for {arch}")
    meta.expect(key("block_count"), "u32")
    n_layers = meta.value(key("block_count"))
    if not 1 <= n_layers <= _MAX_LAYERS:
        raise bad_key(key("block_count"), f"is {n_layers} (1 to {_MAX_LAYERS} allowed)")
    for suffix, kind in _ARCH_KEYS.items():
        if key(suffix) in meta:
            meta.expect(key(suffix), kind, n_layers)
    # Every float hyperparameter feeds the compute graph as is: a NaN or an infinity poisons every logit.
    for name in meta.keys():
        if name.startswith(key("")) and meta.type(name) in _FLOAT_TYPES and not math.isfinite(meta.value(name)):
            raise bad_key(name, f"is {meta.value(name)}, not a finite number")

    for suffix in ("context_length", "embedding_length"):
        if meta.value(key(suffix)) == 0:
            raise bad_key(key(suffix), "is 0")
    nextn = meta.value(key("nextn_predict_layers"))
    if nextn is not None and nextn > n_layers:
        raise bad_key(key("nextn_predict_layers"), f"is {nextn}, more than the {n_layers} layers")
    scaling = meta.value(key("rope.scaling.type"))
    if scaling is not None and scaling not in _ROPE_SCALING_TYPES:
        known = ", ".join(_ROPE_SCALING_TYPES)
        raise bad_key(key("rope.scaling.type"), f"is {show(scaling)}; llama.cpp knows {known}")
    _check_experts(meta, key)
    if arch in _REQUIRED_BY_ARCH:
        epsilon = meta.value(key("attention.layer_norm_rms_epsilon"))
        if not epsilon > 0:
            raise bad_key(key("attention.layer_norm_rms_epsilon"), f"is {epsilon}, not positive")
        if meta.value(key("attention.head_count")) == 0:
            raise bad_key(key("attention.head_count"), "is 0")


def _check_experts(meta: Meta, key: Callable[[str], str]) -> None:
    """The mixture-of-experts counts, as load_hparams asserts them."""
    n_expert = meta.value(key("expert_count")) or 0
    used = meta.value(key("expert_used_count"))
    per_layer = not isinstance(used, int)  # an array: its type and length are checked, its items are not read
    n_used = 0 if per_layer else used
    groups = meta.value(key("expert_group_count")) or 0
    groups_used = meta.value(key("expert_group_used_count")) or 0
    if n_expert > _MAX_EXPERTS:
        raise bad_key(key("expert_count"), f"is {n_expert} (at most {_MAX_EXPERTS})")
    if n_used > n_expert:
        raise bad_key(key("expert_used_count"), f"is {n_used}, more than the {n_expert} experts")
    if n_expert == 0:
        if groups:
            raise bad_key(key("expert_group_count"), f"is {groups} in a model without experts")
        return
    if used is not None and not per_layer and n_used == 0:
        raise bad_key(key("expert_used_count"), f"is 0 with {n_expert} experts")
    if groups >= n_expert:
        raise bad_key(key("expert_group_count"), f"is {groups}, not fewer than the {n_expert} experts")
    if groups > 1 and (n_expert % groups or not 0 < groups_used < groups):
        raise bad_key(
            key("expert_group_count"),
            f"is {groups}: it must divide the {n_expert} experts and exceed expert_group_used_count "
            f"({groups_used}, at least 1)",
        )


# ---------------------------------------------------------------------------------------------- tensor types

# ggml types a transformer's weights never have: llama.cpp loads a norm or a projection of one of these and then
# aborts when its CPU kernels meet it ("binary_op: unsupported types"). F32 and I32 (and F16 and I16) have the same
# size, so a mangled type code can swap them without moving any offset.
_NOT_WEIGHT_TYPES = {24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64"}


def check_tensor_types(arch: str, tensors: Iterable[tuple[str, int]]) -> None:
    """For the architectures edgespec knows, every tensor is a float or quantized weight: (name, ggml type) pairs."""
    if arch not in _REQUIRED_BY_ARCH:
        return  # another architecture may keep integer tensors; llama.cpp's loader is its judge
    for name, ggml_type in tensors:
        if ggml_type in _NOT_WEIGHT_TYPES:
            raise Corrupt(
                f"tensor {show(name)} has type {_NOT_WEIGHT_TYPES[ggml_type]}; a {arch} model's weights are floats "
                "or quantized (llama.cpp would abort computing with it)"
            )


# ---------------------------------------------------------------------------------------------- vocabulary


def check_vocabulary(meta: Meta, token_texts: list[bytes] | None) -> None:
    """The tokenizer arrays llama.cpp reads: present, typed, one length, unique texts, special ids in range."""
    tokens = "tokenizer.ggml.tokens"
    if "tokenizer.ggml.model" not in meta:
        raise bad_key("tokenizer.ggml.model", "is missing, so llama.cpp cannot build a tokenizer")
    if meta.type(tokens) != ARRAY or meta.value(tokens).etype != STRING:
        raise bad_key(tokens, "is missing or not an array of strings, so llama.cpp has no vocabulary")
    n_vocab = meta.value(tokens).count
    if n_vocab == 0:
        raise bad_key(tokens, "is empty")
    for name, etypes in (("tokenizer.ggml.token_type", (_I32,)), ("tokenizer.ggml.scores", (_F32, _I32))):
        if name not in meta:
            continue
        if meta.type(name) != ARRAY or meta.value(name).etype not in etypes:
            raise bad_key(name, f"is not an array of {' or '.join(TYPE_NAMES[t] for t in etypes)}")
        if meta.value(name).count != n_vocab:
            raise bad_key(name, f"has {meta.value(name).count} items for {n_vocab} tokens")
    merges = "tokenizer.ggml.merges"
    if merges in meta and (meta.type(merges) != ARRAY or meta.value(merges).etype != STRING):
        raise bad_key(merges, "is not an array of strings")
    model = meta.str("tokenizer.ggml.model")
    if model in _NEEDS_MERGES and merges not in meta and meta.str("tokenizer.ggml.pre") != "kimi-k2":
        raise bad_key(merges, f"is missing; a {show(model)} tokenizer needs it")
    for name in meta.keys():
        if name.startswith("tokenizer.ggml.") and name.endswith("_token_id"):
            meta.expect(name, "u32")
            if meta.value(name) >= n_vocab:
                raise bad_key(name, f"is {meta.value(name)}, outside the {n_vocab}-token vocabulary")
    duplicate = first_duplicate(token_texts) if token_texts is not None else None
    if duplicate is not None:
        a, b, text = duplicate
        raise bad_key(tokens, f"gives tokens {a} and {b} the same text {show(text)} (llama.cpp aborts on that)")


def first_duplicate(texts: list[bytes]) -> tuple[int, int, bytes] | None:
    """The first pair of ids llama.cpp would map to one text (and that text as llama.cpp sees it), or None.

    llama.cpp keys its text-to-id map by the text up to the first NUL, and renames an empty text ``[EMPTY_<id>]``;
    the fast path (one set, one join) proves neither matters, which is the case for every real vocabulary.
    """
    unique = set(texts)
    if len(unique) == len(texts) and b"" not in unique and b"\0" not in b"".join(texts):
        return None
    seen: dict[bytes, int] = {}
    for i, text in enumerate(texts):
        key = text.split(b"\0", 1)[0] or b"[EMPTY_%d]" % i
        first = seen.setdefault(key, i)
        if first != i:
            return first, i, key
    return None
