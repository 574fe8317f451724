"""The `edgespec` command line: the group and its global options; one module per subcommand, each a thin client
of :mod:`edgespec.api`."""

from __future__ import annotations

import logging

import click

from edgespec.cli.bench import bench
from edgespec.cli.chat import chat
from edgespec.cli.doctor import doctor
from edgespec.cli.generate import generate
from edgespec.cli.models import models
from edgespec.cli.rpc_server import rpc_server
from edgespec.cli.serve import serve


@click.group(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "EDGESPEC"})
@click.option("--verbose", "-v", is_flag=True, help="Log what edgespec says, and llama.cpp's warnings and errors.")
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
    Serve:   edgespec serve --port 8080             (an OpenAI-compatible API)
    Check:   edgespec doctor                 (the llama.cpp build, GPU offload plan, measured costs)
    Split:   edgespec rpc-server (machine B), then --rpc B:50052 on A   (a model bigger than one machine)
    """
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(name)s: %(message)s")


for command in (generate, chat, models, bench, serve, doctor, rpc_server):
    main.add_command(command)
