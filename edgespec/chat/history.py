"""Saved conversations: one JSON file per chat under the user's data directory.

``$EDGESPEC_DATA/chats/<id>.json`` when ``EDGESPEC_DATA`` is set (tests), else
``$XDG_DATA_HOME/edgespec/chats/<id>.json`` (``~/.local/share/edgespec/chats`` by default). Each save writes a
temporary file and renames it over the old one, so a crash mid-save leaves the previous version intact.

An assistant message keeps, besides its text, the runs of text that came from accepted drafts (``spans``), the
finish reason and the engine's stats, so a resumed chat shows what the live one showed.
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
    def from_json(cls, data: dict) -> Message:
        return cls(
            role=str(data["role"]),
            content=str(data["content"]),
            spans=[(str(text), bool(flag)) for text, flag in data.get("spans", [])],
            finish_reason=data.get("finish_reason"),
            stats=data.get("stats"),
        )


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
    def from_json(cls, data: dict) -> Conversation:
        return cls(
            id=str(data["id"]),
            created=str(data.get("created", "")),
            updated=str(data.get("updated", "")),
            system=data.get("system"),
            target=data.get("target"),
            draft=data.get("draft"),
            messages=[Message.from_json(m) for m in data.get("messages", [])],
        )


@dataclass(frozen=True)
class ChatSummary:
    id: str
    updated: str
    n_messages: int
    title: str


class ChatStore:
    """Conversations as JSON files in one directory (created on the first save)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else data_dir() / "chats"

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
        """The chat with this id, or the only one whose id starts with it."""
        path = self.path(chat_id)
        if not path.is_file():
            matches = [p for p in self._files() if p.stem.startswith(chat_id)]
            if len(matches) != 1:
                what = "no saved chat" if not matches else f"{len(matches)} saved chats match"
                raise EdgespecError(f"{what} '{chat_id}' in {self.root} (see `edgespec chat --list`)")
            path = matches[0]
        try:
            return Conversation.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise EdgespecError(f"cannot read saved chat {path}: {exc}") from exc

    def latest(self) -> Conversation:
        """The most recently saved chat (an unreadable file is passed over)."""
        for path in sorted(self._files(), key=lambda p: (p.stat().st_mtime, p.name), reverse=True):
            try:
                return self.load(path.stem)
            except EdgespecError:
                continue
        raise EdgespecError(f"no saved chats in {self.root}")

    def list(self) -> list[ChatSummary]:
        """Saved chats, most recently updated first; unreadable files are skipped."""
        out = []
        for path in self._files():
            try:
                c = Conversation.from_json(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            out.append(ChatSummary(c.id, c.updated, len(c.messages), c.title))
        return sorted(out, key=lambda s: (s.updated, s.id), reverse=True)

    def _files(self) -> Sequence[Path]:
        return sorted(self.root.glob("*.json")) if self.root.is_dir() else []
