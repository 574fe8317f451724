"""`edgespec bench`: decoding strategies measured side by side, one module per job.

* :mod:`~edgespec.bench.workloads`: the task classes of prompts, and a prompt rendered for the target;
* :mod:`~edgespec.bench.strategies`: the strategies' names and the engine each runs;
* :mod:`~edgespec.bench.measure`: one measured generation (its record, the engine's own clock);
* :mod:`~edgespec.bench.peers`: llama-cpp-python's own loops as peers;
* :mod:`~edgespec.bench.runner`: the suite run under every strategy, with the lookup ceiling (how and why);
* :mod:`~edgespec.bench.report`: the run's result, its summaries and the report printed from them;
* :mod:`~edgespec.bench.tables`: text tables, ranges and percentiles every report uses;
* :mod:`~edgespec.bench.probes`: this machine's decode costs, its width-change cost and the loop's own cost;
* :mod:`~edgespec.bench.load`: the suite sent by N clients at once (``--concurrency``), servers as peers.

Import from the module that holds a name: this package re-exports nothing.
"""
