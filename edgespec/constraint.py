"""Constrained output: a JSON schema, a regular expression or a grammar decides which tokens may come next.

The constraint engine is llguidance (what llama.cpp, vLLM, SGLang and OpenAI use): it compiles the grammar, and
from the model's own token texts computes each position's *mask*, the set of tokens that keep the output a prefix
of something the grammar accepts (~50 µs a position for a 152k vocabulary, measured here).

One definition of the constrained distribution, for plain decoding, the draft's q and the verifier's p alike: at
each position mask the forbidden tokens, then penalties, top-k, top-p, min-p and temperature as without a
constraint (:func:`edgespec.warp.warp_row`). Under speculation the position's mask depends on the tokens before
it, so the constraint is *forked* along the draft: row i is masked with the state after the committed text plus
``d_1..d_{i-1}`` (:meth:`Constraint.mask`), and only committed tokens advance the real state
(:meth:`Constraint.commit`); a rejection rolls back nothing that was committed.

A position whose mask allows a single token is forced: that token is proposed as a draft without running any
drafter (:meth:`Constraint.forced`) and the target accepts it with probability 1 (p is 1 on it after the mask).

Grammar formats: a JSON schema (llguidance's subset of draft 2020-12; what it cannot compile is an error naming
the problem), any JSON object, a regular expression (Rust's ``regex`` syntax), and a grammar in llguidance's
Lark syntax or in llama.cpp's GBNF (converted to Lark by llguidance).
"""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Literal

import numpy as np

from edgespec.errors import InvalidParameterError, ModelError

GrammarKind = Literal["json_schema", "json_object", "regex", "lark", "gbnf"]
KINDS: tuple[str, ...] = ("json_schema", "json_object", "regex", "lark", "gbnf")

# JSON as Python's json.dumps writes it: ", " between items, ": " after keys, no other whitespace. A fixed layout
# leaves the schema's punctuation forced (free drafts), where flexible whitespace would leave every separator a
# choice among spaces and newlines.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Grammar:
    """What the output must match. Build one with :meth:`json_schema`, :meth:`json_object`, :meth:`regex`,
    :meth:`lark` or :meth:`gbnf`; ``text`` is the schema (as JSON text), the pattern or the grammar."""

    kind: GrammarKind
    text: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidParameterError(f"grammar kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not isinstance(self.text, str):
            raise InvalidParameterError(f"a {self.kind} must be given as text, got {type(self.text).__name__}")

    @staticmethod
    def json_schema(schema: dict[str, Any] | str | bool) -> Grammar:
        """Output a JSON document valid under ``schema`` (a dict, or its JSON text)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise InvalidParameterError(f"json_schema is not valid JSON: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise InvalidParameterError(f"a JSON schema is an object (or true/false), got {type(schema).__name__}")
        # Not sorted: the order of "properties" is the order the output writes them in.
        return Grammar("json_schema", json.dumps(schema))

    @staticmethod
    def json_object() -> Grammar:
        """Output any JSON object (OpenAI's ``response_format: {"type": "json_object"}``)."""
        return Grammar("json_object")

    @staticmethod
    def regex(pattern: str) -> Grammar:
        """Output a string that matches ``pattern`` in full (Rust ``regex`` syntax)."""
        return Grammar("regex", pattern)

    @staticmethod
    def lark(grammar: str) -> Grammar:
        """Output a sentence of ``grammar``, in llguidance's Lark syntax (it may embed ``%json {...}``)."""
        return Grammar("lark", grammar)

    @staticmethod
    def gbnf(grammar: str) -> Grammar:
        """Output a sentence of ``grammar``, in llama.cpp's GBNF (``root ::= ...``)."""
        return Grammar("gbnf", grammar)

    def describe(self) -> str:
        return "JSON object" if self.kind == "json_object" else self.kind.replace("_", " ")

    def compiled(self) -> str:
        """llguidance's grammar definition; :class:`InvalidParameterError` naming the problem when it has none."""
        return _compiled(self)


_compile_lock = threading.Lock()
_compile_cache: dict[Grammar, str] = {}


def _compiled(grammar: Grammar) -> str:
    with _compile_lock:
        known = _compile_cache.get(grammar)
    if known is not None:
        return known
    llg = _llguidance()
    try:
        if grammar.kind in ("json_schema", "json_object"):
            schema: Any = {"type": "object"} if grammar.kind == "json_object" else json.loads(grammar.text)
            if isinstance(schema, dict):
                options = schema.get("x-guidance", {})
                if not isinstance(options, dict):
                    raise ValueError(f"x-guidance must be an object of llguidance's JSON options, got {options!r}")
                schema = {**schema, "x-guidance": {**JSON_LAYOUT, **options}}
            text = llg.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        elif grammar.kind == "regex":
            text = llg.LLMatcher.grammar_from_regex(grammar.text)
        else:
            text = llg.grammar_from("lark" if grammar.kind == "lark" else "gbnf", grammar.text)
    except (ValueError, TypeError) as e:
        raise InvalidParameterError(f"the {grammar.describe()} cannot be compiled: {e}") from None
    problem = llg.LLMatcher.validate_grammar(text)
    if problem:
        raise InvalidParameterError(f"the {grammar.describe()} cannot be compiled: {_first_line(problem)}")
    with _compile_lock:
        if len(_compile_cache) > 256:  # grammars come from requests: keep the cache bounded
            _compile_cache.clear()
        _compile_cache[grammar] = text
    return text


# Matchers at the start of a text, per model and grammar, to copy: a server's clients send the same schema again and
# again, and building a matcher costs milliseconds where a copy costs microseconds.
MATCHERS_PER_MODEL = 64


def _fresh_matcher(model: Any, grammar: Grammar) -> Any:
    """A matcher of ``grammar`` for ``model``'s vocabulary, at the start of the text; :class:`InvalidParameterError`
    when the model cannot use the grammar."""
    base = getattr(model, "model", model)  # a Slot's model
    text = grammar.compiled()
    with _tokenizers_lock:
        known: dict[str, Any] | None = getattr(base, "_constraint_matchers", None)
        template = known.get(text) if known is not None else None
    if template is None:
        template = _llguidance().LLMatcher(tokenizer_for(model), text, log_level=0)
        if template.is_error():
            raise InvalidParameterError(
                f"the {grammar.describe()} cannot be used with this model: {_first_line(template.get_error())}"
            )
        with _tokenizers_lock:
            known = getattr(base, "_constraint_matchers", None)
            if known is None or len(known) >= MATCHERS_PER_MODEL:
                known = {}
                base._constraint_matchers = known
            known[text] = template
    return template.deep_copy()


def _first_line(message: str) -> str:
    """llguidance's message, shortened to its first line and its "error:" lines (it also draws the source)."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    keep = lines[:1] + [line for line in lines[1:] if line.lower().startswith("error")][:2]
    return "; ".join(keep)


def _llguidance():
    try:
        import llguidance
    except ImportError as e:  # a dependency in pyproject.toml, but an embedding app may have left it out
        raise InvalidParameterError(f"constrained output needs the llguidance package ({e})") from None
    return llguidance


# ----- the model's tokens, as llguidance sees them ------------------------------------------------------------
_tokenizers_lock = threading.Lock()


def tokenizer_for(model: Any) -> Any:
    """llguidance's tokenizer for ``model`` (or a sequence of it): built once per model (~1 s for 152k tokens)."""
    return _vocabulary(model)[0]


def end_tokens(model: Any) -> list[int]:
    """The model's end-of-generation tokens."""
    return _vocabulary(model)[1]


def _vocabulary(model: Any) -> tuple[Any, list[int]]:
    base = getattr(model, "model", model)  # a Slot's model
    with _tokenizers_lock:
        known = getattr(base, "_constraint_vocabulary", None)
        if known is not None:
            return known
        llg = _llguidance()
        n_vocab = base.n_vocab
        eog = [t for t in range(n_vocab) if base.is_eog(t)]
        if hasattr(base, "_vocab"):  # a llama.cpp model: llguidance reads its vocabulary and tokenizer directly
            from llguidance.llamacpp import lltokenizer_from_vocab

            with warnings.catch_warnings():  # it reads each token's attributes with a since-renamed function
                warnings.simplefilter("ignore", DeprecationWarning)
                tokenizer = lltokenizer_from_vocab(base._vocab, n_vocab=n_vocab, eos_token=eog or None)
        else:  # anything else with token pieces and a tokenizer (the tests' fakes)
            tokenizer = llg.LLTokenizer(llg.TokenizerWrapper(_Pieces(base, eog)), n_vocab=n_vocab)
        base._constraint_vocabulary = (tokenizer, eog)
        return tokenizer, eog


class _Pieces:
    """The interface llguidance's TokenizerWrapper reads: token bytes, special tokens, a tokenize function (greedy
    longest match over the token texts: a model without llama.cpp's tokenizer has no other)."""

    def __init__(self, model: Any, eog: list[int]) -> None:
        self.eos_token_id = eog[0] if eog else 0
        self.bos_token_id = None
        self.special_token_ids = eog
        self.tokens = [b"<eog>" if t in eog else model.piece(t) for t in range(model.n_vocab)]
        self._ids: dict[bytes, int] = {}
        for t, piece in enumerate(self.tokens):
            if piece and t not in eog:
                self._ids.setdefault(piece, t)
        self._longest = max((len(p) for p in self._ids), default=1)

    def __call__(self, text: str | bytes) -> list[int]:
        data = text.encode() if isinstance(text, str) else text
        out, i = [], 0
        while i < len(data):
            for n in range(min(self._longest, len(data) - i), 0, -1):
                t = self._ids.get(data[i : i + n])
                if t is not None:
                    out.append(t)
                    i += n
                    break
            else:
                raise ValueError(f"no token for byte {data[i]!r}")
        return out


# ----- one position's allowed tokens --------------------------------------------------------------------------
class Mask:
    """The tokens allowed at one position: llguidance's bitmask (bit ``t`` of the little-endian bytes)."""

    __slots__ = ("bits", "count", "_only", "_dense")

    def __init__(self, bits: bytes) -> None:
        self.bits = bits
        value = int.from_bytes(bits, "little")  # once a position: its count, and its one token when forced
        self.count = value.bit_count()
        self._only = value.bit_length() - 1 if self.count == 1 else None
        self._dense: np.ndarray | None = None

    def allows(self, token: int) -> bool:
        byte = token >> 3
        return byte < len(self.bits) and (self.bits[byte] >> (token & 7)) & 1 == 1

    def only(self) -> int | None:
        """The one allowed token, when there is exactly one."""
        return self._only

    def dense(self, n_vocab: int) -> np.ndarray:
        """``[n_vocab]`` booleans (for whole rows)."""
        if self._dense is None or self._dense.shape[0] != n_vocab:
            bits = np.unpackbits(np.frombuffer(self.bits, dtype=np.uint8), bitorder="little")[:n_vocab]
            dense = np.zeros(n_vocab, dtype=bool)
            dense[: bits.shape[0]] = bits.astype(bool)
            self._dense = dense
        return self._dense


# ----- a request's constraint -------------------------------------------------------------------------------
class Constraint:
    """The constraint's state after a request's committed tokens, and its fork along the current draft.

    ``is_end``: whether a token ends the generation (the model's end-of-generation tokens), after which nothing is
    forced.
    """

    def __init__(self, grammar: Grammar, model: Any, is_end: Callable[[int], bool]) -> None:
        self.grammar = grammar
        self._matcher = _fresh_matcher(model, grammar)
        self._is_end = is_end
        self._model = model
        self._end_mask: Mask | None = None
        self._fork: list[int] = []  # draft tokens the matcher has consumed beyond the committed text
        self._masks: list[Mask] = []  # _masks[i]: the mask after the committed text + _fork[:i]
        self.rereads = 0  # rows whose candidates held too few allowed tokens, read again whole
        self.seconds = 0.0  # spent in the constraint engine: masks, consuming and rolling back tokens

    def mask(self, draft: Sequence[int], i: int) -> Mask:
        """The mask of the position after the committed text plus ``draft[:i]``; those tokens must each be allowed
        where they stand (a verify reads row i only after accepting ``d_1..d_i-1``, which p allowed)."""
        if len(self._masks) > i and self._fork[:i] == list(draft[:i]):
            return self._masks[i]  # known (the draft's q and the verify's p ask for the same rows)
        t0 = perf_counter()
        try:
            return self._mask(draft, i)
        finally:
            self.seconds += perf_counter() - t0

    def _mask(self, draft: Sequence[int], i: int) -> Mask:
        self._follow(draft, i)
        while len(self._masks) <= i:
            j = len(self._masks)
            if j > len(self._fork):
                token = draft[j - 1]
                if self._is_end(token) and self._masks[j - 1].allows(token):
                    # Nothing follows the end of generation: a row after it (the bonus row of a draft that ends
                    # there) allows only an end, and the fork never takes the end token in (llguidance's rollback
                    # does not count it).
                    return self._ends()
                if not self._masks[j - 1].allows(token) or not self._matcher.consume_token(token):
                    raise ValueError(f"draft token {token} is not allowed at draft position {j}")
                self._fork.append(token)
            mask = Mask(self._matcher.compute_bitmask())
            if mask.count == 0:  # llguidance allows nothing only from an error state
                raise ModelError(f"constraint: no token is allowed here ({self._matcher.get_error() or 'no reason'})")
            self._masks.append(mask)
        return self._masks[i]

    def _ends(self) -> Mask:
        if self._end_mask is None:
            bits = np.zeros(self._model.n_vocab, dtype=bool)
            bits[end_tokens(self._model)] = True
            self._end_mask = Mask(np.packbits(bits, bitorder="little").tobytes())
        return self._end_mask

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens``, proposed after the committed text, the constraint allows in a row."""
        if not tokens:
            return 0
        t0 = perf_counter()
        self._follow(tokens, len(tokens))  # keep the fork where the tokens agree with it: its masks stay valid
        keep = len(self._fork)
        n = keep + self._matcher.validate_tokens(list(tokens[keep:]))
        end = next((i for i, t in enumerate(tokens[:n]) if self._is_end(t)), None)
        self.seconds += perf_counter() - t0
        return n if end is None else end + 1  # nothing after an end is drafted

    def forced(self, limit: int) -> list[int]:
        """Tokens the constraint forces after the committed text, one allowed token a position (at most ``limit``;
        an end-of-generation token ends them)."""
        tokens: list[int] = []
        while len(tokens) < limit:
            only = self.mask(tokens, len(tokens)).only()
            if only is None:
                break
            tokens.append(only)
            if self._is_end(only):
                break
        return tokens

    def commit(self, tokens: Sequence[int]) -> None:
        """The round committed ``tokens``: the real state advances by them (each was allowed where it stands)."""
        t0 = perf_counter()
        self._follow((), 0)
        if tokens:
            self._masks.clear()  # computed for the state before them
        for token in tokens:
            if self._is_end(token):
                break  # the output ends here (the mask allowed it: the grammar is complete)
            if not self._matcher.consume_token(token):
                raise ModelError(f"constraint: committed token {token} was not allowed ({self._matcher.get_error()})")
        self.seconds += perf_counter() - t0

    @property
    def complete(self) -> bool:
        """The committed text is a sentence of the grammar."""
        return self._matcher.is_accepting()

    def _follow(self, draft: Sequence[int], i: int) -> None:
        """Roll the fork back to its longest prefix that agrees with ``draft[:i]``."""
        fork = self._fork
        keep = 0
        limit = min(len(fork), i)
        while keep < limit and fork[keep] == draft[keep]:
            keep += 1
        if keep < len(fork):
            self._matcher.rollback(len(fork) - keep)
            del fork[keep:]
            del self._masks[keep + 1 :]
