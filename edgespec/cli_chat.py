"""``edgespec chat``: the Textual chat on a terminal, a plain REPL otherwise (or with ``--no-tui``).

The options mirror ``edgespec generate``'s. They are declared here rather than imported from
:mod:`edgespec.cli`, which imports this module while it is being built.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from edgespec.errors import EdgespecError

DEFAULT_MAX_TOKENS = 1024  # a chat reply may be long; the session also cuts it to what fits the context


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def _draft_len(_ctx: click.Context, _param: click.Parameter, value: str | None) -> int | str | None:
    if value is None:
        return None
    from edgespec.chat_session import parse_draft_len

    try:
        return parse_draft_len(value)
    except EdgespecError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("chat")
@click.option("--pair", help="A target/draft pair from models.toml (default: the registry's default).")
@click.option("--target", "-m", help="Target model: a GGUF path or a models.toml name.")
@click.option("--draft", "-d", help="Draft model: a GGUF path, a models.toml name, or 'none'.")
@click.option("--n-ctx", default=4096, show_default=True, help="Context window in tokens.")
@click.option("--n-gpu-layers", "-ngl", default=0, show_default=True, help="Target layers on GPU (-1: all).")
@click.option("--n-gpu-layers-draft", "-ngld", type=int, default=None, help="Draft layers on the GPU.")
@click.option("--threads", "-t", type=int, default=None, help="CPU threads (default: physical cores).")
@click.option("--draft-len", callback=_draft_len, help="'auto', 'off' or a fixed γ (default: the pair's).")
@click.option("--lookup/--no-lookup", default=True, show_default=True, help="Also draft by prompt lookup.")
@click.option("--temperature", "--temp", default=0.8, show_default=True, help="0 = greedy.")
@click.option("--top-k", default=40, show_default=True, help="0 = off.")
@click.option("--top-p", default=0.95, show_default=True, help="1 = off.")
@click.option("--min-p", default=0.05, show_default=True, help="0 = off.")
@click.option("--seed", type=int, default=None, help="Seed for reproducible replies.")
@click.option("--max-tokens", "-n", default=DEFAULT_MAX_TOKENS, show_default=True, help="Reply length cap.")
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
    from edgespec.history import ChatStore, Conversation

    store = ChatStore()
    try:
        if opts["list_chats"]:
            _list(store)
            return
        conversation = _conversation(store, opts["resume"], opts["system"])
        params = _params(opts)
        target, draft, draft_len = _models(opts, conversation)
    except EdgespecError as exc:
        _fail(str(exc))
        return
    if conversation is None:
        conversation = Conversation(system=opts["system"])
    conversation.target, conversation.draft = target, draft  # what `--resume` reloads next time

    def load(progress, *, show_fetch_progress: bool = False):
        from edgespec.api import load as load_models

        return load_models(
            target,
            draft,
            n_ctx=opts["n_ctx"],
            n_gpu_layers=opts["n_gpu_layers"],
            n_gpu_layers_draft=opts["n_gpu_layers_draft"],
            n_threads=opts["threads"],
            draft_len=draft_len,
            lookup=opts["lookup"],
            progress=progress,
            show_fetch_progress=show_fetch_progress,
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
    from edgespec.backend import default_threads

    return max(1, min(default_threads(), (os.cpu_count() or 2) - 1))


def _list(store) -> None:
    chats = store.list()
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


def _params(opts: dict[str, Any]):
    from edgespec.sampling import SamplingParams

    return SamplingParams(
        temperature=opts["temperature"],
        top_k=opts["top_k"],
        top_p=opts["top_p"],
        min_p=opts["min_p"],
        seed=opts["seed"],
        max_tokens=opts["max_tokens"],
    )


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
        from edgespec.registry import resolve_pair

        chosen = resolve_pair(pair)
        target, hint = chosen.target, chosen.draft_len
        draft = draft if draft is not None else chosen.draft
    if draft is not None and draft.lower() == "none":
        draft = None
    draft_len = opts["draft_len"] if opts["draft_len"] is not None else hint
    return target, draft, draft_len


def _run_repl(load, params, store, conversation) -> None:
    from edgespec.chat_session import ChatSession
    from edgespec.repl import run_repl

    def progress(stage: str, fraction: float) -> None:
        if sys.stderr.isatty():
            click.echo(f"\rloading {stage} model {fraction:4.0%}", err=True, nl=False)

    try:
        runtime = load(progress, show_fetch_progress=True)
    except EdgespecError as exc:
        _fail(str(exc))
        return
    if sys.stderr.isatty():
        click.echo("\r\x1b[K", err=True, nl=False)
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
        _fail(app.load_error)
