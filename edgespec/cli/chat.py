"""``edgespec chat``: the Textual chat on a terminal, a plain REPL otherwise (or with ``--no-tui``).

The model and sampling options are ``edgespec generate``'s (:mod:`edgespec.cli.common`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from edgespec.cli.common import fail, load_options, model_options, sampling_options, sampling_params
from edgespec.errors import EdgespecError

DEFAULT_MAX_TOKENS = 1024  # a chat reply may be long; the session also cuts it to what fits the context


@click.command("chat")
@model_options
@sampling_options(max_tokens=DEFAULT_MAX_TOKENS)
@click.option("--system", help="System prompt of a new chat.")
@click.option(
    "--resume",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[ID]",
    help="Reopen a saved chat (the most recent without ID; an ID prefix is enough).",
)
@click.option("--list", "list_chats", is_flag=True, help="List the saved chats and exit.")
@click.option("--no-tui", is_flag=True, help="A plain line REPL (used anyway when not on a terminal).")
def chat(**opts: Any) -> None:
    """Chat with a model, watching speculative decoding work.

    Accepted draft tokens are highlighted and a meter shows acceptance, tokens per verify and tokens/s.
    Chats are saved after every turn ($XDG_DATA_HOME/edgespec/chats, or $EDGESPEC_DATA/chats).
    Type /help in the chat for its commands; F1 in the TUI lists its keys.
    """
    from edgespec.chat.history import ChatStore, Conversation

    store = ChatStore()
    try:
        if opts["list_chats"]:
            _list(store)
            return
        conversation = _conversation(store, opts["resume"], opts["system"])
        params = sampling_params(opts)
        target, draft, draft_len = _models(opts, conversation)
    except EdgespecError as exc:
        _report_set_aside(store, besides=str(exc))
        fail(str(exc))
        return
    _report_set_aside(store)
    if conversation is None:
        conversation = Conversation(system=opts["system"])
    conversation.target, conversation.draft = target, draft  # what `--resume` reloads next time

    def load(progress, *, show_fetch_progress: bool = False):
        from edgespec.api import load as load_models

        return load_models(
            target,
            draft,
            draft_len=draft_len,
            progress=progress,
            show_fetch_progress=show_fetch_progress,
            **load_options(opts),
        )

    if opts["no_tui"] or not (sys.stdin.isatty() and sys.stdout.isatty()):
        _run_repl(load, params, store, conversation)
    else:
        opts["threads"] = _threads_beside_ui(opts["threads"])
        _run_tui(load, params, store, conversation)


def _threads_beside_ui(requested: int | None) -> int:
    """Leave a core to the UI thread. llama.cpp's workers spin while they wait for each other, so one that
    shares its core with the UI stalls every decode (3-4x slower replies were measured on two cores)."""
    if requested is not None:
        return requested
    from edgespec.models.backend import default_threads

    return max(1, min(default_threads(), (os.cpu_count() or 2) - 1))


def _report_set_aside(store, *, besides: str | None = None) -> None:
    """Say which saved chats could not be read (moved aside or left alone), one warning line each, on stderr.

    Printed before the TUI takes the screen, so they are there again when it closes. ``besides``: the error about to
    be printed, which may already be about one of them.
    """
    for note in store.set_aside:
        if str(note) != besides:
            click.echo(f"warning: {note}", err=True)


def _list(store) -> None:
    chats = store.list()
    _report_set_aside(store)
    if not chats:
        click.echo(f"no saved chats in {store.root}", err=True)
        return
    for c in chats:
        click.echo(f"{c.id}  {c.updated.replace('T', ' ')[:16]}  {c.n_messages:3d} msgs  {c.title}")


def _conversation(store, resume: str | None, system: str | None):
    if resume is None:
        return None
    conversation = store.load(resume) if resume else store.latest()
    if system is not None:
        conversation.system = system
    return conversation


def _models(opts: dict[str, Any], conversation) -> tuple[str, str | None, int | str]:
    """Target, draft and draft length from the options; a resumed chat reloads its own models by default."""
    pair, target, draft = opts["pair"], opts["target"], opts["draft"]
    if pair is not None and target is not None:
        raise click.UsageError("use either --pair or --target/--draft, not both")
    hint: int | str = "auto"
    if target is None and pair is None and conversation is not None and conversation.target:
        target = conversation.target
        draft = draft if draft is not None else (conversation.draft or "none")
    if target is None:
        from edgespec.models.registry import resolve_pair

        chosen = resolve_pair(pair)
        target, hint = chosen.target, chosen.draft_len
        draft = draft if draft is not None else chosen.draft
    if draft is None:  # a target named without --draft: its pair's draft, else the best one here
        from edgespec.cli.common import default_draft

        draft, pair_hint = default_draft(target)
        hint = pair_hint or hint
    if draft is not None and draft.lower() == "none":
        draft = None
    draft_len = opts["draft_len"] if opts["draft_len"] is not None else hint
    return target, draft, draft_len


def _run_repl(load, params, store, conversation) -> None:
    from edgespec.chat.repl import run_repl
    from edgespec.chat.session import ChatSession

    def progress(stage: str, fraction: float) -> None:
        if sys.stderr.isatty():
            click.echo(f"\rloading {stage} model {fraction:4.0%}", err=True, nl=False)

    try:
        runtime = load(progress, show_fetch_progress=True)
    except EdgespecError as exc:
        fail(str(exc))
        return
    if sys.stderr.isatty():
        click.echo("\r\x1b[K", err=True, nl=False)
    if runtime.draft_choice is not None:
        click.echo(runtime.draft_choice, err=True)
    with runtime:
        code = run_repl(ChatSession(runtime, params, store, conversation))
    sys.exit(code)


def _run_tui(load, params, store, conversation) -> None:
    from tui.app import ChatApp

    app = ChatApp(load, params, store, conversation)
    try:
        app.run()
    finally:
        if app.runtime is not None:
            app.runtime.close()
    if app.session is not None and app.session.conversation.messages:
        chat_id = app.session.conversation.id
        click.echo(f"chat saved as {chat_id} (edgespec chat --resume {chat_id})", err=True)
    if app.load_error is not None:
        fail(app.load_error)
