"""`edgespec generate`: one prompt in, the continuation streamed out."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from edgespec.cli.common import (
    constraint_options,
    describe_stats,
    load_runtime,
    model_options,
    sampling_options,
    sampling_params,
    user_errors,
)


@click.command()
@click.argument("prompt")
@model_options
@sampling_options()
@constraint_options
@click.option("--chat", "as_chat", is_flag=True, help="Wrap PROMPT as a user message in the model's chat template.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (text, tokens, stats) at the end.")
def generate(prompt: str, as_chat: bool, as_json: bool, **opts: Any) -> None:
    """Generate a continuation of PROMPT ('-' reads it from stdin).

    Text streams to stdout as it is verified; statistics go to stderr. --json-schema, --json-object, --regex or
    --grammar constrain the output (exactly: the constrained distribution, with or without speculation); tokens
    the constraint forces are proposed as free drafts.
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
                            "stats": {
                                **result.stats.as_dict(),
                                # where each model ran: "CPU", or the GPU and how many layers
                                "target_placement": runtime.target.placement,
                                "draft_placement": runtime.draft.placement if runtime.draft else None,
                                "bit_exact": runtime.target.bit_exact,
                            },
                            "target": runtime.target.path,
                            "draft": runtime.draft.path if runtime.draft is not None else None,
                        }
                    )
                )
            else:
                click.echo()
                click.echo(describe_stats(result.stats), err=True)
