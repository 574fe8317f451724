"""Saved conversations: one JSON file per chat under the user's data directory.

``$EDGESPEC_DATA/chats/<id>.json`` when ``EDGESPEC_DATA`` is set (tests), else
``$XDG_DATA_HOME/edgespec/chats/<id>.json`` (``~/.local/share/edgespec/chats`` by default). Each save writes a
temporary file and renames it over the old one, so a crash mid-save leaves the previous version intact.

An assistant message keeps, besides its text, the runs of text that came from accepted drafts (``spans``), the
finish reason and the engine's stats, so a resumed chat shows what the live one showed.

A file that does not parse as a chat (cut short, edited by hand, damaged on disk) is never overwritten and never
silently passed over: the store renames it to ``<id>.json.corrupt`` (out of the way of ``*.json``, kept for the
user) and records a :class:`SetAside` that the CLI reports. A file from a newer edgespec, or one that cannot be read
at all (permissions), is left where it is and recorded the same way.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from edgespec.errors import EdgespecError
from edgespec.paths import user_path

FORMAT_VERSION = 1


def data_dir() -> Path:
    """``$EDGESPEC_DATA``, else ``$XDG_DATA_HOME/edgespec`` (``~/.local/share/edgespec``)."""
    return user_path("EDGESPEC_DATA", "XDG_DATA_HOME", ".local/share", "edgespec")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_id() -> str:
    # Sortable by creation time (so "the most recent" is also the last name), unique thanks to the suffix.
    return datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def merge_spans(pieces: Iterable[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """Join neighbouring pieces of the same origin: a reply has a few dozen runs, not one entry per token."""
    runs: list[tuple[str, bool]] = []
    for text, from_draft in pieces:
        if not text:
            continue
        if runs and runs[-1][1] == from_draft:
            runs[-1] = (runs[-1][0] + text, from_draft)
        else:
            runs.append((text, from_draft))
    return runs


@dataclass
class Message:
    role: str  # "user" or "assistant" (the system prompt lives on the Conversation)
    content: str
    spans: list[tuple[str, bool]] = field(default_factory=list)  # assistant only: (text, from_draft) runs
    finish_reason: str | None = None  # assistant only; "cancelled" or "error" marks a partial reply
    stats: dict | None = None  # assistant only: Stats.as_dict() of the reply

    def to_json(self) -> dict:
        out: dict = {"role": self.role, "content": self.content}
        if self.spans:
            out["spans"] = [[text, from_draft] for text, from_draft in self.spans]
        if self.finish_reason is not None:
            out["finish_reason"] = self.finish_reason
        if self.stats is not None:
            out["stats"] = self.stats
        return out

    @classmethod
    def from_json(cls, data: object) -> Message:
        """Parse one saved message; ValueError names what is wrong (a chat file is not trusted to be well-formed)."""
        if not isinstance(data, dict):
            raise ValueError(f"a message is {type(data).__name__}, not an object")
        role, content = data.get("role"), data.get("content")
        if role not in ("user", "assistant"):
            raise ValueError(f"a message has role {role!r}")
        if not isinstance(content, str):
            raise ValueError("a message has no text content")
        spans = data.get("spans", [])
        if not isinstance(spans, list) or not all(
            isinstance(s, list) and len(s) == 2 and isinstance(s[0], str) and isinstance(s[1], bool) for s in spans
        ):
            raise ValueError("a message's spans are not [text, from_draft] pairs")
        finish_reason, stats = data.get("finish_reason"), data.get("stats")
        if finish_reason is not None and not isinstance(finish_reason, str):
            raise ValueError("a message's finish_reason is not text")
        if stats is not None and not isinstance(stats, dict):
            raise ValueError("a message's stats are not an object")
        return cls(role, content, [(text, flag) for text, flag in spans], finish_reason, stats)


@dataclass
class Conversation:
    id: str = field(default_factory=new_id)
    created: str = field(default_factory=_now)
    updated: str = field(default_factory=_now)
    system: str | None = None
    target: str | None = None  # model references as given, so `--resume` can reload the same pair
    draft: str | None = None
    messages: list[Message] = field(default_factory=list)

    @property
    def title(self) -> str:
        first = next((m.content for m in self.messages if m.role == "user"), "")
        line = " ".join(first.split())
        return line[:60] + ("…" if len(line) > 60 else "") if line else "(empty)"

    def for_model(self) -> list[dict]:
        """The messages for the chat template: the system prompt, then every turn (partial replies too)."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [{"role": m.role, "content": m.content} for m in self.messages]

    def to_json(self) -> dict:
        return {
            "version": FORMAT_VERSION,
            "id": self.id,
            "created": self.created,
            "updated": self.updated,
            "system": self.system,
            "target": self.target,
            "draft": self.draft,
            "messages": [m.to_json() for m in self.messages],
        }

    @classmethod
    def from_json(cls, data: object) -> Conversation:
        """Parse a saved chat; ValueError names what is wrong, :class:`NewerFormatError` a file from a newer
        edgespec."""
        if not isinstance(data, dict):
            raise ValueError(f"the file holds {type(data).__name__}, not a chat object")
        version = data.get("version", FORMAT_VERSION)
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ValueError(f"format version {version!r}")
        if version > FORMAT_VERSION:
            raise NewerFormatError(f"written by a newer edgespec (format {version}, this one reads {FORMAT_VERSION})")
        chat_id = data.get("id")
        if not isinstance(chat_id, str) or not chat_id:
            raise ValueError("no chat id")
        texts = {key: data.get(key) for key in ("created", "updated", "system", "target", "draft")}
        for key, value in texts.items():
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{key} is not text")
        messages = data.get("messages", [])
        if not isinstance(messages, list):
            raise ValueError("messages is not a list")
        return cls(
            id=chat_id,
            created=texts["created"] or "",
            updated=texts["updated"] or "",
            system=texts["system"],
            target=texts["target"],
            draft=texts["draft"],
            messages=[Message.from_json(m) for m in messages],
        )


class NewerFormatError(ValueError):
    """A chat file from a newer edgespec: well-formed, probably, but not this version's to rewrite."""


@dataclass(frozen=True)
class SetAside:
    """A saved chat the store could not read: where it was, why, and where it went (None: left in place)."""

    path: Path
    reason: str
    moved_to: Path | None

    def __str__(self) -> str:
        if self.moved_to is None:
            return f"saved chat {self.path} cannot be read ({self.reason}); left as it is"
        return f"saved chat {self.path} is corrupt ({self.reason}); moved it to {self.moved_to.name} (not deleted)"


@dataclass(frozen=True)
class ChatSummary:
    id: str
    updated: str
    n_messages: int
    title: str


class ChatStore:
    """Conversations as JSON files in one directory (created on the first save).

    ``set_aside`` lists the files this store could not read so far, for the caller to report.
    """

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else data_dir() / "chats"
        self.set_aside: list[SetAside] = []

    def path(self, chat_id: str) -> Path:
        return self.root / f"{chat_id}.json"

    def save(self, conversation: Conversation) -> Path:
        conversation.updated = _now()
        self.root.mkdir(parents=True, exist_ok=True)
        target = self.path(conversation.id)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{conversation.id}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(conversation.to_json(), f, ensure_ascii=False, indent=1)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target

    def load(self, chat_id: str) -> Conversation:
        """The chat with this id, or the only one whose id starts with it.

        A file that does not parse is moved aside, and the error says where to.
        """
        path = self.path(chat_id)
        if not path.is_file():
            matches = [p for p in self._files() if p.stem.startswith(chat_id)]
            if len(matches) != 1:
                what = "no saved chat" if not matches else f"{len(matches)} saved chats match"
                raise EdgespecError(f"{what} '{chat_id}' in {self.root} (see `edgespec chat --list`)")
            path = matches[0]
        conversation = self._read(path)
        if conversation is None:
            problem = next((s for s in self.set_aside if s.path == path), None)
            raise EdgespecError(str(problem) if problem else f"no saved chat '{chat_id}' in {self.root}")
        return conversation

    def latest(self) -> Conversation:
        """The most recently saved chat; a file that does not parse is moved aside (and recorded) on the way."""
        for path in sorted(self._files(), key=_mtime_and_name, reverse=True):
            conversation = self._read(path)
            if conversation is not None:
                return conversation
        raise EdgespecError(f"no saved chats in {self.root}")

    def list(self) -> list[ChatSummary]:
        """Saved chats, most recently updated first; files that do not parse are moved aside (and recorded)."""
        out = []
        for path in self._files():
            c = self._read(path)
            if c is not None:
                out.append(ChatSummary(c.id, c.updated, len(c.messages), c.title))
        return sorted(out, key=lambda s: (s.updated, s.id), reverse=True)

    def _read(self, path: Path) -> Conversation | None:
        """The chat in ``path``, or None after recording why not (and moving a corrupt file out of the way)."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None  # removed since it was listed: nothing to report
        except OSError as exc:
            return self._record(path, exc.strerror or str(exc), move=False)
        try:
            return Conversation.from_json(json.loads(raw.decode("utf-8")))
        except NewerFormatError as exc:
            return self._record(path, str(exc), move=False)
        except UnicodeDecodeError:
            return self._record(path, "not UTF-8 text", move=True)
        except json.JSONDecodeError as exc:
            reason = f"not JSON: {exc.msg} at line {exc.lineno}" if raw.strip() else "empty"
            return self._record(path, reason, move=True)
        except (ValueError, RecursionError) as exc:
            return self._record(path, str(exc), move=True)

    def _record(self, path: Path, reason: str, move: bool) -> None:
        moved_to = None
        if move:
            moved_to = _free_name(path.with_name(path.name + ".corrupt"))
            try:
                os.rename(path, moved_to)
            except OSError as exc:
                moved_to = None
                reason += f"; could not move it aside: {exc.strerror or exc}"
        if all(s.path != path for s in self.set_aside):
            self.set_aside.append(SetAside(path, reason, moved_to))
        return None

    def _files(self) -> Sequence[Path]:
        return sorted(self.root.glob("*.json")) if self.root.is_dir() else []


def _mtime_and_name(path: Path) -> tuple[float, str]:
    try:
        return path.stat().st_mtime, path.name
    except OSError:  # removed since it was listed
        return 0.0, path.name


def _free_name(path: Path) -> Path:
    """``path``, or ``path.1``, ``path.2``, ...: the first name not taken (an earlier corrupt copy stays)."""
    candidate, n = path, 0
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate
