"""``edgespec chat --no-tui``: the chat as a plain line-by-line REPL, for scripts and dumb terminals.

Each input line is a message (or a slash command). The reply streams to stdout; everything else (the
banner, command feedback, the stats line, errors) goes to stderr, so
``edgespec chat --no-tui < questions.txt > answers.txt`` captures only the replies. Ctrl+C stops a reply;
Ctrl+C or Ctrl+D at the prompt leaves.
"""

from __future__ import annotations

import sys
from typing import TextIO

from edgespec.chat.session import ChatSession, Command, help_lines, parse_command, stats_summary
from edgespec.errors import EdgespecError
from edgespec.events import Chunk, Finished

# ANSI: accepted draft tokens in green when highlighting (a terminal only).
_DRAFT_ON, _DRAFT_OFF = "\x1b[32m", "\x1b[0m"


class Repl:
    def __init__(
        self,
        session: ChatSession,
        *,
        stdin: TextIO | None = None,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        highlight: bool | None = None,
    ) -> None:
        self.session = session
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.interactive = self.stdin.isatty()
        self.highlight = self.stdout.isatty() if highlight is None else highlight

    def say(self, text: str) -> None:
        print(text, file=self.stderr, flush=True)

    def run(self) -> int:
        runtime = self.session.runtime
        conversation = self.session.conversation
        draft = runtime.draft.name if runtime.draft is not None else "none (prompt lookup only)"
        self.say(f"edgespec chat · target {runtime.target.name} · draft {draft} · chat {conversation.id}")
        if conversation.messages:
            self.say(f"resumed: {len(conversation.messages)} messages, starting with {conversation.title!r}")
        self.say("/help lists the commands; /quit or Ctrl+D leaves.")
        while True:
            if self.interactive:
                self.stdout.write("> ")
                self.stdout.flush()
            try:
                line = self.stdin.readline()
            except KeyboardInterrupt:
                break
            if not line:  # end of input
                break
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            try:
                command = parse_command(line)
                if command is None:
                    self.turn(line)
                elif command.name == "quit":
                    break
                else:
                    self.command(command)
            except EdgespecError as exc:
                self.say(f"error: {exc}")
            if self.session.save_error:
                self.say(f"warning: {self.session.save_error}")
        chat_id = self.session.conversation.id
        if self.session.conversation.messages:
            self.say(f"saved as {chat_id} (edgespec chat --resume {chat_id})")
        return 0

    def command(self, command: Command) -> None:
        if command.name == "help":
            self.say("\n".join(help_lines()))
        elif command.name == "stop":
            self.say("nothing to stop: in the REPL, Ctrl+C stops a reply")
        elif command.name == "highlight":
            self.highlight = not self.highlight
            self.say(f"highlighting {'on' if self.highlight else 'off'}")
        else:
            self.say(self.session.apply(command) or "")

    def turn(self, text: str) -> None:
        events = self.session.reply(text)
        finished: Finished | None = None
        try:
            for event in events:
                if isinstance(event, Chunk):
                    self._write(event)
                else:
                    finished = event
        except KeyboardInterrupt:
            self.stdout.write("\n")
            self.say("[stopped]")
        finally:
            events.close()  # saves the partial reply and leaves the engine consistent
        if finished is not None:
            self.stdout.write("\n")
            self.stdout.flush()
            self.say(f"[{stats_summary(finished.stats)}]")

    def _write(self, chunk: Chunk) -> None:
        if self.highlight:
            out = "".join(f"{_DRAFT_ON}{s.text}{_DRAFT_OFF}" if s.from_draft else s.text for s in chunk.spans)
        else:
            out = chunk.text
        self.stdout.write(out)
        self.stdout.flush()


def run_repl(session: ChatSession, **kwargs) -> int:
    return Repl(session, **kwargs).run()
