"""Record the Qwen 1.5B target's greedy plain outputs for the agent sequences into tests/data/agent_traces.json.

Run once (CPU heavy: ~40 requests of up to 160 tokens, several minutes on 2 cores):

    .venv/bin/python tests/record_agent_traces.py [--out tests/data/agent_traces.json]

The file has the shape of qwen_traces.json (``about``, ``steps``: the decode cost of b = 1..17 tokens in single steps,
``traces``: task, id, prompt and output token ids) plus each trace's ``sequence``, in the order the sequence runs.
The classes: ``agent`` (edgespec/workloads/agent.toml) and ``held-out-agent`` (tests/data/held-out-agent.toml).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from edgespec.bench.probes import decode_costs
from edgespec.bench.workloads import load_tasks, prompt_job
from edgespec.engine import Engine
from edgespec.models.backend import Model
from edgespec.paths import model_cache_dir
from edgespec.sampling import SamplingParams

DATA = Path(__file__).resolve().parent / "data"
MAX_TOKENS = 160


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DATA / "agent_traces.json")
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    ap.add_argument("--steps-only", action="store_true", help="measure the decode costs again, keep the traces")
    args = ap.parse_args()
    path = model_cache_dir() / "qwen2.5-coder-1.5b" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    if args.steps_only:  # (a machine busy with other work while the traces were recorded gives a curve of noise)
        data = json.loads(args.out.read_text())
        with Model(path, n_ctx=2048) as model:
            data["steps"] = _steps(decode_costs(model, widths=range(1, 18), reps=16))
        args.out.write_text(json.dumps(data, separators=(",", ":")) + "\n")
        print(f"steps {data['steps']}")
        return
    tasks = load_tasks(["agent"]) + load_tasks(source=DATA / "held-out-agent.toml")
    traces = []
    with Model(path, n_ctx=2048) as model:
        engine = Engine(model, None, draft_len=0, lookup=False)
        params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
        started = time.perf_counter()
        for task in tasks:
            for prompt in task.prompts:
                tokens, grammar = prompt_job(model, prompt)
                assert grammar is None, prompt.id  # the agent prompts ask for their format, unconstrained
                *_, done = engine.stream(tokens, params)
                output = list(done.tokens)
                trace = dict(task=task.name, sequence=prompt.sequence, id=prompt.id, prompt=tokens, output=output)
                traces.append(trace)
                print(f"{task.name}/{prompt.id}: {len(tokens)} + {len(output)} tokens "
                      f"({time.perf_counter() - started:.0f} s)", flush=True)  # fmt: skip
        costs = decode_costs(model, widths=range(1, 18))
    about = (
        f"Greedy generations of qwen2.5-coder-1.5b-instruct Q4_K_M (plain decoding, {args.max_tokens} tokens at most) "
        "for the agent sequences (edgespec/workloads/agent.toml, task agent) and the held-out ones "
        "(tests/data/held-out-agent.toml, task held-out-agent), each request a fresh conversation, in the order each "
        "sequence runs, as token ids; and the decode cost of b = 1..17 tokens in single steps measured on the 2-core "
        "dev CPU right after (median after a 64-token context). Recorded with tests/record_agent_traces.py."
    )
    steps = _steps(costs)
    args.out.write_text(json.dumps(dict(about=about, steps=steps, traces=traces), separators=(",", ":")) + "\n")
    print(f"wrote {args.out}: {len(traces)} traces, steps {steps}")


def _steps(costs: dict[int, float]) -> list[float]:
    return [round(costs[b] / costs[1], 3) for b in range(1, 18)]


if __name__ == "__main__":
    main()
