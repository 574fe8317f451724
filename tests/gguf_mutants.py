"""Mutated GGUF models, and a runner that puts each through `edgespec models info` and `generate` in its own process.

The fuzz test (tests/test_gguf_fuzz.py) and the before/after measurement share this module:

    python tests/gguf_mutants.py --seed 7 --per-model 160 smollm2=SMOLLM.gguf gemma3=GEMMA.gguf

A corpus is a list of :class:`Mutant` built from real files by a seeded generator: each mutant names its source
file and holds the bytes to overwrite (and, for a truncation, where the file ends). Nothing is written until a
mutant runs: the worker copies the source, patches it, runs the command and deletes the copy.

Each mutant runs in a process forked from a runner that has imported edgespec and llama_cpp but never computed
(llama.cpp's OpenMP pool does not survive a fork), so a load costs a fraction of a second instead of a Python
start-up. The outcome of a run is one of:

- ``loaded``: exit 0 (the model loaded and generated; for `models info`: it printed the facts);
- ``clean``: exit 1 with nothing but one ``error: ...`` line on stderr;
- ``noisy``: exit 1 with ``error: ...`` plus other output (log lines, a stray message);
- ``crash``: anything else: a traceback, another exit status, a signal, a hang.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# GGUF value types (gguf.GGUFValueType); the walker below needs only their widths.
_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "B", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9

# Values a mangled integer field tends to take: zero, one, sign and width boundaries.
_U32_SPECIALS = (0, 1, 2, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF)
_U64_SPECIALS = (0, 1, 2, 0x7FFFFFFF, 0xFFFFFFFF, 1 << 32, (1 << 63) - 1, 1 << 63, (1 << 64) - 1)


# ---------------------------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Field:
    """One fixed-width field of the file: where it is, its struct format and its value there."""

    offset: int
    fmt: str  # struct format without the byte order: "I", "Q", "f", ...
    value: int | float
    label: str

    @property
    def width(self) -> int:
        return struct.calcsize("<" + self.fmt)


@dataclass(frozen=True)
class Span:
    """A length-prefixed string: the u64 length field and where its bytes are."""

    length: Field
    start: int  # first byte of the text
    label: str

    @property
    def end(self) -> int:
        return self.start + int(self.length.value)


@dataclass
class Entry:
    """A metadata key/value pair: its key, value type and (for arrays) element type and count."""

    key: Span
    key_text: str
    vtype: Field
    start: int
    end: int
    scalar: Field | None = None  # a scalar value
    text: Span | None = None  # a string value
    etype: Field | None = None  # arrays only
    count: Field | None = None
    items: list[Span] = field(default_factory=list)  # the elements of a string array
    scalar_items: tuple[int, str] | None = None  # a scalar array: offset of its first item, struct format


@dataclass
class TensorEntry:
    name: Span
    n_dims: Field
    dims: list[Field]
    ggml_type: Field
    offset: Field
    start: int
    end: int


@dataclass
class Layout:
    """Where every structural field of a GGUF file is (read from a well-formed file)."""

    size: int
    version: Field
    n_tensors: Field
    n_kv: Field
    entries: list[Entry]
    tensors: list[TensorEntry]
    data_start: int
    alignment: int

    def entry(self, key: str) -> Entry | None:
        return next((e for e in self.entries if e.key_text == key), None)

    @property
    def metadata_end(self) -> int:
        return self.entries[-1].end if self.entries else 24

    @property
    def tensor_infos_end(self) -> int:
        return self.tensors[-1].end if self.tensors else self.metadata_end


class _Walker:
    def __init__(self, blob: bytes | memoryview) -> None:
        self.blob = blob
        self.pos = 0

    def field(self, fmt: str, label: str) -> Field:
        value = struct.unpack_from("<" + fmt, self.blob, self.pos)[0]
        f = Field(self.pos, fmt, value, label)
        self.pos += f.width
        return f

    def span(self, label: str) -> Span:
        length = self.field("Q", f"{label} length")
        s = Span(length, self.pos, label)
        self.pos += int(length.value)
        return s

    def text(self, s: Span) -> str:
        return bytes(self.blob[s.start : s.end]).decode("utf-8", errors="replace")


def read_layout(path: Path) -> Layout:
    """Walk a well-formed GGUF file and record the offset of every header, metadata and tensor-info field."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(min(size, 64 << 20))  # metadata and tensor infos of the models here fit many times over
    w = _Walker(head)
    w.pos = 4
    version, n_tensors, n_kv = w.field("I", "version"), w.field("Q", "tensor count"), w.field("Q", "metadata count")
    entries: list[Entry] = []
    alignment = 32
    for _ in range(int(n_kv.value)):
        start = w.pos
        key = w.span(f"key of entry #{len(entries)}")
        key_text = w.text(key)
        vtype = w.field("I", f"{key_text} value type")
        entry = Entry(key=key, key_text=key_text, vtype=vtype, start=start, end=start)
        t = int(vtype.value)
        if t == _STRING:
            entry.text = w.span(key_text)
        elif t == _ARRAY:
            entry.etype = w.field("I", f"{key_text} element type")
            entry.count = w.field("Q", f"{key_text} element count")
            et = int(entry.etype.value)
            if et == _STRING:
                entry.items = [w.span(f"{key_text}[{i}]") for i in range(int(entry.count.value))]
            else:  # a scalar array (token types, scores): where its items start, to mutate any of them
                fmt = _SCALAR_FORMATS[et]
                entry.scalar_items = (w.pos, fmt)
                w.pos += struct.calcsize("<" + fmt) * int(entry.count.value)
        else:
            entry.scalar = w.field(_SCALAR_FORMATS[t], key_text)
            if key_text == "general.alignment":
                alignment = int(entry.scalar.value)
        entry.end = w.pos
        entries.append(entry)
    tensors: list[TensorEntry] = []
    for i in range(int(n_tensors.value)):
        start = w.pos
        name = w.span(f"tensor #{i} name")
        tname = w.text(name)
        n_dims = w.field("I", f"tensor {tname} n_dims")
        dims = [w.field("Q", f"tensor {tname} dim {d}") for d in range(int(n_dims.value))]
        ggml_type = w.field("I", f"tensor {tname} type")
        offset = w.field("Q", f"tensor {tname} offset")
        tensors.append(TensorEntry(name, n_dims, dims, ggml_type, offset, start, w.pos))
    data_start = -(-w.pos // alignment) * alignment
    return Layout(size, version, n_tensors, n_kv, entries, tensors, data_start, alignment)


# ---------------------------------------------------------------------------------------------- mutants


@dataclass(frozen=True)
class Mutant:
    """A source file plus the bytes that differ: overwrite each (offset, bytes), then cut at ``truncate``."""

    source: Path
    model: str
    label: str
    patches: tuple[tuple[int, bytes], ...] = ()
    truncate: int | None = None

    def write(self, dst: Path) -> None:
        """Write the mutated file: a kernel-side copy of the kept bytes, then the patches."""
        keep = os.path.getsize(self.source) if self.truncate is None else self.truncate
        with open(self.source, "rb") as src, open(dst, "wb") as out:
            copied = 0
            while copied < keep:  # sendfile: the kernel copies, also from a disk to a RAM disk
                n = os.sendfile(out.fileno(), src.fileno(), copied, keep - copied)
                if n == 0:
                    break
                copied += n
            for offset, data in self.patches:
                if offset < keep:
                    os.pwrite(out.fileno(), data[: keep - offset], offset)


def _pack(fmt: str, value: int | float) -> bytes:
    if fmt in "bhiq":  # a signed field: write the same bits as the unsigned special value
        bits = struct.calcsize(fmt) * 8
        value = int(value) & ((1 << bits) - 1)
        fmt = fmt.upper()
    elif fmt in "BHIQ":
        value = int(value) & ((1 << (struct.calcsize(fmt) * 8)) - 1)
    return struct.pack("<" + fmt, value)


def _special_for(f: Field, rng: random.Random) -> int | float:
    """A value a mangled ``f`` might hold: a boundary, a neighbour of the real value, or noise."""
    if f.fmt in "fd":
        return rng.choice([0.0, -1.0, float("nan"), float("inf"), -float("inf"), 1e30, -1e-30, f.value * 2])
    bits = f.width * 8
    v = int(f.value)
    pool = [0, 1, 2, v - 1, v + 1, v * 2, v // 2, rng.getrandbits(bits), rng.randrange(0, 1 << min(bits, 20))]
    pool += list(_U64_SPECIALS if bits == 64 else _U32_SPECIALS if bits == 32 else (0, 1, (1 << bits) - 1))
    return rng.choice(pool)


class _Builder:
    """Draws single mutations of one kind each from a layout; ``build`` combines them into a corpus."""

    def __init__(self, layout: Layout, blob_head: bytes, rng: random.Random) -> None:
        self.layout = layout
        self.head = blob_head
        self.rng = rng
        self.scalars = [e for e in layout.entries if e.scalar is not None]
        self.strings = [e for e in layout.entries if e.text is not None]
        self.arrays = [e for e in layout.entries if e.count is not None]
        self.string_arrays = [e for e in self.arrays if e.items]
        tokens = layout.entry("tokenizer.ggml.tokens")
        self.tokens = tokens.items if tokens is not None else []
        by_len: dict[int, list[Span]] = defaultdict(list)
        for s in self.tokens:
            by_len[int(s.length.value)].append(s)
        self.tokens_by_len = {n: group for n, group in by_len.items() if len(group) > 1 and n > 0}
        self.special_ids = [e for e in self.scalars if e.key_text.startswith("tokenizer.ggml.") and "_id" in e.key_text]
        self.kinds: dict[str, Callable[[], tuple[str, list[tuple[int, bytes]]]]] = {
            "header": self.header,
            "key-length": self.key_length,
            "value-type": self.value_type,
            "element-type": self.element_type,
            "array-count": self.array_count,
            "string-length": self.string_length,
            "scalar-value": self.scalar_value,
            "special-id": self.special_id,
            "token-text": self.token_text,
            "tensor-name": self.tensor_name,
            "tensor-dims": self.tensor_dims,
            "tensor-type": self.tensor_type,
            "tensor-offset": self.tensor_offset,
            "byte": self.byte,
        }

    def _set(self, f: Field, value: int | float) -> tuple[str, list[tuple[int, bytes]]]:
        shown = value if isinstance(value, float) else f"{value:#x}" if value > 4096 else str(value)
        return f"{f.label} {f.value!r} -> {shown}", [(f.offset, _pack(f.fmt, value))]

    def header(self):
        f = self.rng.choice([self.layout.version, self.layout.n_tensors, self.layout.n_kv])
        if f is self.layout.version:
            return self._set(f, self.rng.choice([0, 1, 2, 4, 0x03000000, 0xFFFFFFFF, self.rng.getrandbits(32)]))
        return self._set(f, _special_for(f, self.rng))

    def key_length(self):
        e = self.rng.choice(self.layout.entries)
        return self._set(e.key.length, _special_for(e.key.length, self.rng))

    def _type_code(self) -> int:
        return self.rng.choice([*range(0, 14), _ARRAY, _STRING, 13, 99, 255, 0x80000000, self.rng.getrandbits(32)])

    def value_type(self):
        e = self.rng.choice(self.layout.entries)
        return self._set(e.vtype, self._type_code())

    def element_type(self):
        e = self.rng.choice(self.arrays)
        return self._set(e.etype, self._type_code())

    def array_count(self):
        e = self.rng.choice(self.arrays)
        return self._set(e.count, _special_for(e.count, self.rng))

    def string_length(self):
        pool = [e.text for e in self.strings]
        for e in self.string_arrays:
            pool.append(self.rng.choice(e.items))
            pool.append(e.items[-1])
        s = self.rng.choice(pool)
        return self._set(s.length, _special_for(s.length, self.rng))

    def scalar_value(self):
        """A metadata number: a scalar (hyperparameters, flags) or an item of an array (token types, scores)."""
        arrays = [e for e in self.arrays if e.scalar_items and e.count.value]
        if arrays and self.rng.random() < 0.3:
            e = self.rng.choice(arrays)
            start, fmt = e.scalar_items
            i = self.rng.randrange(int(e.count.value))
            at = start + i * struct.calcsize("<" + fmt)
            f = Field(at, fmt, struct.unpack_from("<" + fmt, self.head, at)[0], f"{e.key_text}[{i}]")
        else:
            f = self.rng.choice(self.scalars).scalar
        return self._set(f, _special_for(f, self.rng))

    def special_id(self):
        if not self.special_ids:
            return self.scalar_value()
        e = self.rng.choice(self.special_ids)
        n_vocab = len(self.tokens)
        return self._set(e.scalar, self.rng.choice([n_vocab, n_vocab - 1, n_vocab + 100, 0xFFFFFFFF, 0x7FFFFFFF]))

    def token_text(self):
        """Two tokens with one text (llama.cpp asserts on it), a NUL inside a token, or a random byte."""
        how = self.rng.choice(["duplicate", "duplicate", "nul", "byte"])
        if how == "duplicate" and self.tokens_by_len:
            group = self.tokens_by_len[self.rng.choice(sorted(self.tokens_by_len))]
            a, b = self.rng.sample(group, 2)
            text = self.head[b.start : b.end]
            return f"{a.label} := text of {b.label} ({bytes(text)!r})", [(a.start, bytes(text))]
        s = self.rng.choice([t for t in self.tokens if t.length.value > 0])
        at = s.start + self.rng.randrange(int(s.length.value))
        value = 0 if how == "nul" else self.rng.randrange(256)
        return f"{s.label} byte {at - s.start} -> {value}", [(at, bytes([value]))]

    def tensor_name(self):
        t = self.rng.choice(self.layout.tensors)
        same = [
            o for o in self.layout.tensors if o is not t and o.name.length.value == t.name.length.value
        ]
        if same and self.rng.random() < 0.6:
            other = self.rng.choice(same)
            text = self.head[other.name.start : other.name.end]
            return f"{t.name.label} := {bytes(text)!r} (a duplicate)", [(t.name.start, bytes(text))]
        return self._set(t.name.length, _special_for(t.name.length, self.rng))

    def tensor_dims(self):
        t = self.rng.choice(self.layout.tensors)
        if self.rng.random() < 0.3:
            return self._set(t.n_dims, self.rng.choice([0, 1, 2, 3, 4, 5, 8, 0xFFFFFFFF]))
        return self._set(self.rng.choice(t.dims), _special_for(t.dims[0], self.rng))

    def tensor_type(self):
        t = self.rng.choice(self.layout.tensors)
        return self._set(t.ggml_type, self.rng.choice([*range(0, 46), 0x80000000, self.rng.getrandbits(32)]))

    def tensor_offset(self):
        i = self.rng.randrange(len(self.layout.tensors))
        t = self.layout.tensors[i]
        v = int(t.offset.value)
        other = int(self.rng.choice(self.layout.tensors).offset.value)
        data_size = self.layout.size - self.layout.data_start
        pool = [0, v + 1, v - 1, v + 16, v + self.layout.alignment, other, data_size, self.layout.size,
                (1 << 63) - 1, (1 << 64) - 1, (1 << 64) - self.layout.alignment, self.rng.getrandbits(64)]  # fmt: skip
        return self._set(t.offset, self.rng.choice(pool))

    def byte(self):
        """A random byte somewhere: mostly in the metadata and tensor infos, sometimes in the weights."""
        end = self.layout.data_start if self.rng.random() < 0.85 else self.layout.size
        at = self.rng.randrange(4, end)
        value = self.rng.randrange(256)
        return f"byte {at} -> {value}", [(at, bytes([value]))]

    def truncation_points(self) -> list[tuple[str, int]]:
        """Cuts at each structural boundary: header, metadata entries, tensor infos, data."""
        lay = self.layout
        points = [("empty", 0), ("magic", 3), ("version", 8), ("header counts", 16), ("header", 24)]
        for e in lay.entries:
            points.append((f"after entry {e.key_text}", e.end))
            points.append((f"inside entry {e.key_text}", self.rng.randrange(e.start + 1, e.end)))
        points.append(("metadata end", lay.metadata_end))
        for t in lay.tensors:
            points.append((f"after tensor info {self.head[t.name.start : t.name.end].decode()}", t.end))
        points += [
            ("tensor infos end", lay.tensor_infos_end),
            ("data start", lay.data_start),
            ("data start + 1", lay.data_start + 1),
            ("middle of the data", (lay.data_start + lay.size) // 2),
            ("one byte short", lay.size - 1),
        ]
        return points


def build_corpus(sources: dict[str, Path], per_model: int, seed: int) -> list[Mutant]:
    """``per_model`` mutants of each source: ~15 % truncations, ~15 % 2-4 mutations at once, the rest single."""
    corpus: list[Mutant] = []
    for model, path in sources.items():
        rng = random.Random(f"{seed}:{model}")
        layout = read_layout(path)
        with open(path, "rb") as f:
            head = f.read(layout.data_start)
        builder = _Builder(layout, head, rng)
        kinds = sorted(builder.kinds)
        cuts = builder.truncation_points()
        # The fixed cuts (header, tensor infos, data) always; entries and tensor infos sampled.
        fixed = [c for c in cuts if not c[0].startswith(("after ", "inside "))]
        sampled = [c for c in cuts if c[0].startswith(("after ", "inside "))]
        n_cuts = max(len(fixed), per_model * 15 // 100)
        chosen = fixed + rng.sample(sampled, min(len(sampled), n_cuts - len(fixed)))
        for label, at in chosen:
            corpus.append(Mutant(path, model, f"truncated: {label} (at {at})", truncate=at))
        n_multi = per_model * 15 // 100
        n_single = per_model - len(chosen) - n_multi
        for i in range(n_single):
            kind = kinds[i % len(kinds)]
            label, patches = builder.kinds[kind]()
            corpus.append(Mutant(path, model, f"{kind}: {label}", tuple(patches)))
        for _ in range(n_multi):
            parts = [builder.kinds[rng.choice(kinds)]() for _ in range(rng.randint(2, 4))]
            label = " + ".join(p[0] for p in parts)
            corpus.append(Mutant(path, model, f"multi: {label}", tuple(p for _, ps in parts for p in ps)))
    return corpus


# ---------------------------------------------------------------------------------------------- running


@dataclass(frozen=True)
class Outcome:
    mutant: Mutant
    status: str  # of `generate`: loaded / clean / noisy / crash
    detail: str  # exit status or signal, and the last lines of output
    seconds: float
    info_status: str  # of `models info` on the same file (loaded: it printed the facts)
    info_detail: str


# What every mutant runs: the command of issue #10 (default sampling, seeded), kept cheap: one thread per process
# (two run side by side), no cost calibration, a small context.
GENERATE_ARGS = (
    "generate", "hello", "--draft", "none", "-n", "4", "--seed", "1",
    "--draft-len", "off", "--no-lookup", "--threads", "1", "--n-ctx", "128",
)  # fmt: skip


def _child(mutant: Mutant, workdir: Path, outputs: Path) -> None:
    """In the forked process: write the file, run `models info` then `generate` on it as `python -m edgespec`
    would, and exit with generate's status (info's goes to a file)."""
    code = 3  # the harness itself failed (its traceback goes to the child's stderr)
    model = workdir / f"{os.getpid()}.gguf"
    try:
        _redirect(outputs.with_suffix(".out"), outputs.with_suffix(".err"))
        mutant.write(model)
        info_code = _run_cli(["models", "info", "--json", str(model)], outputs)
        outputs.with_suffix(".info-code").write_text(str(info_code))
        code = _run_cli([*GENERATE_ARGS, "--target", str(model)], None)
    except BaseException:  # noqa: BLE001 - writing the mutant or redirecting output failed: say so, as exit 3
        traceback.print_exc()
    finally:
        try:
            model.unlink(missing_ok=True)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _redirect(out: Path, err: Path) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, path in ((1, out), (2, err)):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(opened, fd)
        os.close(opened)


def _run_cli(args: list[str], info_outputs: Path | None) -> int:
    """Run the CLI in this process and return its exit status; an uncaught exception prints its traceback, as the
    interpreter would. ``info_outputs``: send stdout and stderr to its .info-out/.info-err files for this run only."""
    from edgespec.cli import main

    saved = (os.dup(1), os.dup(2)) if info_outputs is not None else None
    if info_outputs is not None:
        _redirect(info_outputs.with_suffix(".info-out"), info_outputs.with_suffix(".info-err"))
    try:
        main.main(args, prog_name="edgespec", standalone_mode=True)
        return 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - what the interpreter prints for an uncaught error
        traceback.print_exc()
        return 1
    finally:
        if saved is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)


def classify(returncode: int, stdout: str, stderr: str) -> tuple[str, str]:
    """(status, detail) of one run; ``returncode`` as subprocess reports it (negative: killed by that signal)."""
    if returncode < 0:
        return "crash", f"signal {signal.Signals(-returncode).name}: {_tail(stderr)}"
    if "Traceback (most recent call last)" in stderr or "Traceback (most recent call last)" in stdout:
        return "crash", f"traceback: {_tail(stderr)}"
    if returncode == 0:
        return "loaded", stdout.strip()[:60]
    if returncode == 1:
        lines = [line for line in stderr.splitlines() if line.strip()]
        if len(lines) == 1 and lines[0].startswith("error: ") and not stdout.strip():
            return "clean", lines[0]
        if any(line.startswith("error: ") for line in lines):
            return "noisy", " | ".join(lines[-4:])
    return "crash", f"exit {returncode}: {_tail(stderr)}"


def _tail(text: str, n: int = 3) -> str:
    return " | ".join(line for line in text.strip().splitlines()[-n:])


def run_corpus(
    mutants: Sequence[Mutant],
    *,
    jobs: int = 2,
    timeout_s: float = 120.0,
    on_outcome: Callable[[Outcome], None] | None = None,
) -> list[Outcome]:
    """Run every mutant in a forked child, ``jobs`` at a time; returns the outcomes in corpus order."""
    # Imported before forking, so every child starts warm (these imports cost more than most runs).
    import llama_cpp  # noqa: F401

    import edgespec.api  # noqa: F401
    import edgespec.cli  # noqa: F401
    import edgespec.models.fetch  # noqa: F401
    import edgespec.models.gguf  # noqa: F401

    results: dict[int, Outcome] = {}
    with tempfile.TemporaryDirectory(prefix="gguf-fuzz-", dir=_scratch_dir(mutants, jobs)) as tmp:
        workdir = Path(tmp)
        env_dirs = {name: workdir / name.lower() for name in ("EDGESPEC_CACHE", "EDGESPEC_DATA")}
        saved = {name: os.environ.get(name) for name in (*env_dirs, "EDGESPEC_CONFIG", "EDGESPEC_LLAMA_LOG")}
        for name, path in env_dirs.items():
            path.mkdir()
            os.environ[name] = str(path)
        os.environ["EDGESPEC_CONFIG"] = str(workdir / "no-user-models.toml")
        os.environ.pop("EDGESPEC_LLAMA_LOG", None)
        running: dict[int, tuple[int, float]] = {}  # pid -> (index, started)
        pending = list(range(len(mutants)))
        try:
            while pending or running:
                while pending and len(running) < jobs:
                    index = pending.pop(0)
                    pid = os.fork()
                    if pid == 0:
                        _child(mutants[index], workdir, workdir / str(index))
                    running[pid] = (index, time.monotonic())
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    _kill_overdue(running, timeout_s)
                    time.sleep(0.01)
                    continue
                index, started = running.pop(pid)
                returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                out_text = _read(workdir / f"{index}.out")
                err_text = _read(workdir / f"{index}.err")
                if returncode == -signal.SIGKILL and "timed out" not in err_text:
                    err_text += f"\n(killed after {timeout_s:.0f} s: timed out)"
                kind, detail = classify(returncode, out_text, err_text)
                info_code = _read(workdir / f"{index}.info-code")
                info = classify(
                    int(info_code) if info_code else returncode,  # no code written: the child died in `info`
                    _read(workdir / f"{index}.info-out"),
                    _read(workdir / f"{index}.info-err"),
                )
                outcome = Outcome(mutants[index], kind, detail, time.monotonic() - started, *info)
                results[index] = outcome
                for leftover in workdir.glob(f"{pid}.gguf"):
                    leftover.unlink()  # a child killed by a signal could not remove its copy
                if on_outcome is not None:
                    on_outcome(outcome)
        finally:
            for pid in running:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    return [results[i] for i in range(len(mutants))]


def _scratch_dir(mutants: Sequence[Mutant], jobs: int) -> str | None:
    """A RAM disk when one has room for the files running at once: a disk would have to absorb gigabytes of
    copies (each mutant is a whole model) that live for a second."""
    need = jobs * max(os.path.getsize(m.source) for m in mutants) + (256 << 20)
    shm = Path("/dev/shm")
    try:
        if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > need:
            return str(shm)
    except OSError:
        pass
    return None  # the system's temporary directory


def _kill_overdue(running: dict[int, tuple[int, float]], timeout_s: float) -> None:
    now = time.monotonic()
    for pid, (_, started) in running.items():
        if now - started > timeout_s:
            os.kill(pid, signal.SIGKILL)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def summarize(outcomes: Iterable[Outcome]) -> dict[str, Counter[str]]:
    """Counts per model and status, plus a 'total' row."""
    table: dict[str, Counter[str]] = defaultdict(Counter)
    for o in outcomes:
        table[o.mutant.model][o.status] += 1
        table["total"][o.status] += 1
    return dict(table)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="well-formed GGUF files to mutate, each as NAME=PATH or PATH")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--per-model", type=int, default=160)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write every outcome here")
    args = parser.parse_args(argv)
    sources = {}
    for spec in args.models:
        name, _, path = spec.rpartition("=")
        sources[name or Path(path).stem] = Path(path)
    corpus = build_corpus(sources, args.per_model, args.seed)
    start = time.monotonic()

    def show(o: Outcome) -> None:
        if o.status not in ("loaded", "clean"):
            print(f"{o.status:6} {o.mutant.model}: {o.mutant.label}\n       {o.detail[:400]}", flush=True)

    outcomes = run_corpus(corpus, jobs=args.jobs, on_outcome=show)
    for model, counts in summarize(outcomes).items():
        print(f"{model}: " + ", ".join(f"{k} {counts[k]}" for k in ("loaded", "clean", "noisy", "crash")))
    seconds: dict[str, float] = defaultdict(float)
    for o in outcomes:
        seconds[o.status] += o.seconds
    print("process seconds by outcome: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(seconds.items())))
    print(f"{len(outcomes)} mutants in {time.monotonic() - start:.0f} s")
    info_failures = [o for o in outcomes if o.info_status not in ("loaded", "clean")]
    print(f"models info: {len(outcomes) - len(info_failures)} answered with the facts or a one-line error")
    for o in info_failures:
        print(f"models info {o.info_status} {o.mutant.model}: {o.mutant.label}\n       {o.info_detail[:400]}")
    if args.json:
        rows = [{"model": o.mutant.model, "label": o.mutant.label, "status": o.status, "detail": o.detail,
                 "seconds": round(o.seconds, 3), "info_status": o.info_status, "info_detail": o.info_detail}
                for o in outcomes]  # fmt: skip
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(o.status in ("loaded", "clean") for o in outcomes) and not info_failures else 1


if __name__ == "__main__":
    sys.exit(main())
