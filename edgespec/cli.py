"""The `edgespec` command line. Every subcommand is a thin client of :mod:`edgespec.api`."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import click

from edgespec.bench import bench
from edgespec.cli_chat import chat
from edgespec.cli_common import (
    describe_stats,
    load_runtime,
    model_options,
    sampling_options,
    sampling_params,
    user_errors,
)
from edgespec.cli_models import models


@click.group(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "EDGESPEC"})
@click.option("--verbose", "-v", is_flag=True, help="Log what edgespec (and llama.cpp's errors) says.")
@click.version_option(package_name="edgespec")
def main(verbose: bool) -> None:
    """edgespec: a big model answering faster on your own machine.

    A small draft model (or prompt lookup) proposes tokens, the target model verifies them all in one batched
    pass, and exact rejection sampling keeps the output distribution the target's own. The controller measures
    what speculation costs here and turns it down (to plain decoding) when it does not pay.

    \b
    Start:   edgespec chat                   (default model pair, fetched on first use)
    Script:  edgespec generate "def fib(n):" --temperature 0
    Models:  edgespec models list
    Measure: edgespec bench --tasks code-edit --max-tokens 64
    """
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(name)s: %(message)s")


@main.command()
@click.argument("prompt")
@model_options
@sampling_options()
@click.option("--chat", "as_chat", is_flag=True, help="Wrap PROMPT as a user message in the model's chat template.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (text, tokens, stats) at the end.")
def generate(prompt: str, as_chat: bool, as_json: bool, **opts: Any) -> None:
    """Generate a continuation of PROMPT ('-' reads it from stdin).

    Text streams to stdout as it is verified; statistics go to stderr.
    """
    if prompt == "-":
        prompt = sys.stdin.read()
    with user_errors():
        params = sampling_params(opts)
        runtime = load_runtime(opts, quiet=as_json)
        with runtime:
            source = runtime.render_chat([{"role": "user", "content": prompt}]) if as_chat else prompt
            events = runtime.stream(source, params)
            try:
                from edgespec.events import Finished

                for event in events:
                    if isinstance(event, Finished):
                        result = event
                    elif not as_json:
                        click.echo(event.text, nl=False)
            except KeyboardInterrupt:
                runtime.cancel()
                for event in events:  # drain: the engine finishes the round and reports
                    if isinstance(event, Finished):
                        result = event
            if as_json:
                click.echo(
                    json.dumps(
                        {
                            "text": result.text,
                            "tokens": list(result.tokens),
                            "finish_reason": result.finish_reason,
                            "stats": result.stats.as_dict(),
                        }
                    )
                )
            else:
                click.echo()
                click.echo(describe_stats(result.stats), err=True)


for command in (chat, models, bench):
    main.add_command(command)
