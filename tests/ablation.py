"""Each mechanism of auto's controller, lookup forecast and lookup drafter removed in turn, replayed on the recorded
generations (tests/data/qwen_*traces.json) at the recorded decode cost curves: each file's own 2-core CPU curve and
the H200's (``H200_PROFILE``). Prints auto's speed over plain decoding per class with the mechanism and without, and
the replay's own spread: the range of the full controller's speed over noise seeds (the timings it is told carry a
log-normal factor of sigma ``--noise``, as a machine's do). The draft model's mechanisms are also run on
simulate()'s synthetic rounds (the only place a draft model pays), and the mechanisms that act on auto's own time
in the GPU emulation of tests/gpu_regime.py (``--emulate``). See docs/benchmarks.md, "Auto's mechanisms, each
removed in turn".

    .venv/bin/python tests/ablation.py                     # every mechanism, by replay and simulation (~1.5 min)
    .venv/bin/python tests/ablation.py --only coverage,substitutions
    .venv/bin/python tests/ablation.py --emulate 1,4       # the GPU emulation (~10 min)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgespec.drafters.controller import DEFAULT_CONTROLLER, Controller  # noqa: E402
from edgespec.drafters.controller_sim import (  # noqa: E402
    CPU_PROFILE,
    GPU_PROFILE,
    H200_PROFILE,
    CostProfile,
    SyntheticDraftModel,
    copy_spans,
    replay,
    simulate,
)
from edgespec.drafters.lookup import DEFAULT_LOOKUP, LookupDrafter  # noqa: E402
from edgespec.drafters.lookup_forecast import DEFAULT_FORECAST, LookupForecast  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
FILES = {"bench": "qwen_traces.json", "corpus": "qwen_corpus_traces.json", "valid": "qwen_validation_traces.json"}
MAX_GAMMA = 16  # the engine's DEFAULT_MAX_GAMMA
CPU_STEP = 0.05  # seconds of a CPU step (only ratios matter but for the change of width's share)
CPU_SWITCH = 0.02  # a change of width, in CPU steps (measured on the dev CPU: ~2 %)
H200_SWITCH = 0.5  # ... in H200 steps (a new graph beside a ~2 ms step)
# The draft model's acceptance on the recorded answers is unknown; 0.65 a token is what the pair showed on code.
MODEL_ALPHA = 0.65


@dataclass
class Variant:
    """A mechanism removed: the controller's, the forecast's and the lookup drafter's numbers that turn it off, and
    whether the replay has a draft model (the draft model's mechanisms only act with one)."""

    controller: dict = field(default_factory=dict)  # ControllerConfig fields
    forecast: dict = field(default_factory=dict)  # ForecastConfig fields
    lookup: dict = field(default_factory=dict)  # LookupConfig fields
    switch_blind: bool = False  # the controller is not told what a change of width costs
    one_bucket: bool = False  # every proposal in one agreement bucket
    model: bool = False
    # The controller's own seconds a round and a drafted row, charged to every replayed round (the clock would make
    # the replay depend on this machine, so they are given); and whether the controller knows them.
    loop: tuple[float, float] | None = None
    loop_blind: bool = False

    def make(self, drafters: list[str], max_gamma: int = 8) -> Controller:
        forecast = replace(DEFAULT_FORECAST, **self.forecast)
        config = replace(DEFAULT_CONTROLLER, forecast=forecast, **self.controller)
        # No plan budget: the controller then reads no clock, and a replay's decisions do not depend on this machine
        # (plan reuse and the pricing of the controller's own time are measured by tests/gpu_regime.py).
        ctl = Controller(drafters, max_gamma=max_gamma, config=config)
        if self.one_bucket and ctl._lookup is not None:
            ctl._lookup = _OneBucket(max_gamma, forecast)
        if self.loop is not None and not self.loop_blind:
            ctl.loop.add(self.loop[0])
            ctl.loop_per_row.add(self.loop[1])
        return ctl


VARIANTS: dict[str, Variant] = {
    "full": Variant(),
    "coverage": Variant(forecast={"copying_coverage": 2.0}),
    "agreement buckets": Variant(forecast={"copying_coverage": 2.0}, one_bucket=True),
    "substitutions": Variant(lookup={"learn_substitutions": False}),
    "source choice": Variant(lookup={"source_candidates": 1}),
    "min_gain margin": Variant(controller={"min_gain": 0.0}),
    "width-change pricing": Variant(switch_blind=True),
    # The draft model's mechanisms, with a draft model in the replay.
    "model: full": Variant(model=True),
    "model: idle decay": Variant(controller={"idle_decay": 1.0}, model=True),
    "model: catch-up allowance": Variant(controller={"catchup_allowance": 0.0}, model=True),
}
# auto's own Python as the GPU emulation measured it (tests/gpu_regime.py, 4 lanes, this 2-core machine): ~50 µs a
# round of plan and observe, ~20 µs more a drafted row; replayed with it charged, priced or not.
LOOP = (50e-6, 20e-6)
LOOP_VARIANTS = {"loop charged, priced": Variant(loop=LOOP), "loop pricing": Variant(loop=LOOP, loop_blind=True)}
# Mechanisms whose purpose is noisy timings: replayed with noise (sigma NOISY) and averaged over the seeds.
NOISY = 0.25
NOISY_VARIANTS = ("full", "min_gain margin")
# The draft model's mechanisms where a draft model can pay: the synthetic GPU profile (not a recorded curve: at the
# recorded ones the draft model loses at any acceptance), on simulate()'s synthetic streams, and the recorded
# profiles for comparison. Scenario: (name, drafters, acceptance by tokens generated, lookup schedule, tokens).
SCENARIOS = [
    ("phase change", ["model"], lambda t: {"model": 0.1 if 2000 <= t < 4000 else 0.9}, 0, 7000),
    ("copy spans", ["model", "lookup"], {"model": 0.7, "lookup": 0.9}, copy_spans(100, 40), 6000),
]
SIM_VARIANTS = ("model: full", "model: idle decay", "model: catch-up allowance")
SIM_PROFILES = {"GPU (synthetic)": GPU_PROFILE, "CPU": CPU_PROFILE, "H200": H200_PROFILE}


@dataclass(frozen=True)
class Curve:
    name: str
    cost: Callable[[int], float]
    switch: float
    draft: float  # the draft model's seconds a token
    catchup: float  # and a token it missed


def curves(steps: list[float]) -> list[Curve]:
    h200 = H200_PROFILE
    return [
        Curve("CPU", lambda b: CPU_STEP * steps[b - 1], CPU_SWITCH * CPU_STEP, 0.515 * CPU_STEP, 0.136 * CPU_STEP),
        Curve("H200", h200.verify, H200_SWITCH * h200.verify(1), h200.draft["model"], h200.catchup["model"]),
    ]


def load() -> dict[str, tuple[list[float], dict[str, list[dict]]]]:
    out = {}
    for tag, name in FILES.items():
        data = json.loads((DATA / name).read_text())
        by_task: dict[str, list[dict]] = {}
        for trace in data["traces"]:
            by_task.setdefault(f"{tag}/{trace['task']}", []).append(trace)
        out[tag] = (data["steps"], by_task)
    return out


class _OneBucket(LookupForecast):
    """The forecast with every proposal in one state, whatever its agreement."""

    def offer(self, tokens: Sequence[int], agreement: int = 0, from_prompt: bool = False) -> None:
        super().offer(tokens, 0, False)


def speeds(variant: Variant, data: dict, noise: float = 0.0, seed: int = 0) -> dict[tuple[str, str], float]:
    """(curve, class) -> auto's speed over plain decoding, one controller a class (as the bench runs them)."""
    out = {}
    for steps, by_task in data.values():
        for curve in curves(steps):
            for task, traces in by_task.items():
                ctl = variant.make(["model", "lookup"] if variant.model else ["lookup"], MAX_GAMMA)
                verify = {b: curve.cost(b) for b in range(1, MAX_GAMMA + 2)}
                draft = {"model": curve.draft} if variant.model else {}
                catchup = {"model": curve.catchup} if variant.model else {}
                ctl.record_costs(verify, draft, catchup, switch=0.0 if variant.switch_blind else curve.switch)
                model = SyntheticDraftModel(MODEL_ALPHA, curve.draft, curve.catchup) if variant.model else None
                lookup = replace(DEFAULT_LOOKUP, **variant.lookup)
                seconds = 0.0
                for i, t in enumerate(traces):
                    result = replay(
                        ctl, t["prompt"], t["output"], curve.cost, lookup=LookupDrafter(lookup),
                        switch_cost=curve.switch, model=model, noise=noise, seed=seed * 1000 + i,
                    )  # fmt: skip
                    seconds += result.seconds
                    if variant.loop is not None:
                        seconds += sum(variant.loop[0] + p.gamma * variant.loop[1] for _, p in result.rounds)
                plain = sum(len(t["output"]) for t in traces) * curve.cost(1)
                out[(curve.name, task)] = plain / seconds
    return out


def simulated(variant: Variant, profile: CostProfile, seed: int) -> dict[str, float]:
    """Scenario -> tok/s of the controller on simulate()'s synthetic rounds, calibrated as the engine does."""
    out = {}
    noisy = replace(profile, noise=0.05)
    for name, drafters, alphas, lookup_len, n in SCENARIOS:
        ctl = variant.make(drafters)
        ctl.record_costs(
            {b: profile.verify(b) for b in range(1, 10)}, {"model": profile.draft["model"]}, dict(profile.catchup)
        )
        out[name] = simulate(ctl, noisy, alphas, n_tokens=n, lookup_len=lookup_len, seed=seed).tokens_per_second
    return out


def table(title: str, results: dict, spread: dict, classes: list[str], curve: str, bases: dict[str, str]) -> None:
    print(f"\n{title}")
    print(f"{'mechanism removed':<26}" + "".join(f"{c:>17}" for c in classes) + "   worst change")
    for name, row in results.items():
        base = results[bases[name]]
        cells = "".join(f"{row[(curve, c)]:17.3f}" for c in classes)
        worst = min(row[(curve, c)] - base[(curve, c)] for c in classes)
        print(f"{name:<26}{cells}   {worst:+.3f}")
    for base, sp in spread.items():
        print(f"{'spread (' + base + ')':<26}" + "".join(f"{sp[(curve, c)]:17.3f}" for c in classes))


# The mechanisms that act on auto's own time, removed in the GPU emulation (tests/gpu_regime.py): what each is
# replaced by.
def _no_loop_pricing(self: Controller, gamma: int) -> float:
    return 0.0


def _no_reuse(self: Controller) -> int:
    return 0


EMULATED = {
    "full": {},
    "loop pricing": {"loop_seconds": _no_loop_pricing},
    "plan reuse": {"_reuse": _no_reuse},
}


def controller_time(task_traces: list[dict], lanes: int, removed: str) -> float:
    """CPU µs a round of the controller's plan and observe, replaying ``task_traces`` at the H200's curve beside
    ``lanes - 1`` other plain rows (as a lane of the engine plans them), every round plain (what a request that
    drafts nothing pays), with the mechanism ``removed`` (a key of :data:`EMULATED`)."""
    from edgespec.drafters.plan import NO_LOAD, Load
    from edgespec.models.microbatch import decode_passes

    saved = {attr: getattr(Controller, attr) for attr in EMULATED[removed]}
    for attr, value in EMULATED[removed].items():
        setattr(Controller, attr, value)
    try:
        total, rounds = 0.0, 0
        for t in task_traces:
            lookup = LookupDrafter()
            context = list(t["prompt"])
            lookup.reset(context)
            ctl = Controller(["lookup"], max_gamma=MAX_GAMMA, plan_budget=0.01)  # the engine's PLAN_BUDGET
            ctl.record_costs({b: H200_PROFILE.verify(b) for b in range(1, 18)}, {}, switch=0.001)
            others = dict.fromkeys(range(lanes - 1), 1)

            def passes(n: int, others: dict[int, int] = others) -> list[int]:
                return decode_passes({**others, lanes - 1: n}, 512, gaps_filled=True)

            load = NO_LOAD
            if lanes > 1:
                load = Load(rows=lanes - 1, tokens=lanes - 1.0, room=60, passes=passes, sequences=lanes - 1)
            for token in t["output"]:
                proposal = lookup.propose(context, MAX_GAMMA).tokens
                t0 = time.thread_time()
                plan = ctl.plan(proposal, load, 100, lookup.last_agreement, lookup.last_from_prompt)
                ctl.observe(
                    plan, n_drafted=0, n_accepted=0, t_draft=0.0, t_verify=H200_PROFILE.verify(lanes),
                    committed=[token], record_verify=False,
                )  # fmt: skip
                total += time.thread_time() - t0
                rounds += 1
                context.append(token)
                lookup.commit(context)
        return total / rounds * 1e6
    finally:
        for attr, value in saved.items():
            setattr(Controller, attr, value)


def emulate(lanes: int, repeats: int, names: list[str]) -> dict[str, dict[str, tuple[float, float, float]]]:
    """Mechanism removed -> class -> (auto / plain by the clock, the medians of ``repeats`` runs; auto's and plain's
    Python in µs a token). The variants take turns, their order reversed every other run (the machine's load drifts).

    The clock's ratio is what the emulation measures, and on a shared 2-core machine it swings by 5-10 % from run to
    run. The Python is the processes' CPU time less what the scripted decodes spend waiting (their spin), a token's
    worth: other processes delay it far less than they delay the clock."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gpu_regime

    classes = gpu_regime.load_traces()
    waited = [0.0]  # CPU time the scripted decodes spent waiting (the spin after the sleep)
    wait = gpu_regime.ScriptedModel._wait

    def timed_wait(self: object, rows: int) -> None:
        t0 = time.thread_time()
        wait(self, rows)
        waited[0] += time.thread_time() - t0

    strategy_of: dict[int, str] = {}
    cpu: dict[str, float] = {}
    runner_of, loop = gpu_regime.engine_runner, gpu_regime.closed_loop

    def tagged_runner(engine: object) -> object:
        runner = runner_of(engine)
        strategy_of[id(runner)] = "auto" if getattr(engine, "draft_len", None) == "auto" else "plain"
        return runner

    def timed_loop(runner: object, *args: object) -> object:
        t0, w0 = time.process_time(), waited[0]
        record = loop(runner, *args)
        key = strategy_of[id(runner)]
        cpu[key] = cpu.get(key, 0.0) + (time.process_time() - t0) - (waited[0] - w0)
        return record

    ratios: dict[str, dict[str, list[float]]] = {n: {c: [] for c in classes} for n in names}
    python: dict[str, dict[str, list[tuple[float, float]]]] = {n: {c: [] for c in classes} for n in names}
    gpu_regime.ScriptedModel._wait = timed_wait
    gpu_regime.engine_runner, gpu_regime.closed_loop = tagged_runner, timed_loop
    try:
        for r in range(repeats):
            for name in names if r % 2 == 0 else names[::-1]:
                saved = {attr: getattr(Controller, attr) for attr in EMULATED[name]}
                for attr, value in EMULATED[name].items():
                    setattr(Controller, attr, value)
                try:
                    for c in classes:
                        cpu.clear()
                        totals = gpu_regime.measure({c: classes[c]}, lanes, rounds=1)
                        plain, auto = totals[(c, "plain")], totals[(c, "auto")]
                        ratios[name][c].append((auto[0] / auto[1]) / (plain[0] / plain[1]))
                        python[name][c].append((cpu["auto"] / auto[0] * 1e6, cpu["plain"] / plain[0] * 1e6))
                finally:
                    for attr, value in saved.items():
                        setattr(Controller, attr, value)
    finally:
        gpu_regime.ScriptedModel._wait = wait
        gpu_regime.engine_runner, gpu_regime.closed_loop = runner_of, loop

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    return {
        n: {
            c: (median(ratios[n][c]), median([a for a, _ in python[n][c]]), median([p for _, p in python[n][c]]))
            for c in classes
        }
        for n in names
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated mechanisms (default: all)")
    parser.add_argument("--seeds", type=int, default=5, help="noise seeds for the spread")
    parser.add_argument("--noise", type=float, default=0.05, help="sigma of the timings' log-normal factor")
    parser.add_argument("--emulate", default="", help="lanes (comma-separated): run the GPU emulation instead")
    parser.add_argument("--repeats", type=int, default=3, help="emulation runs per mechanism (the median is shown)")
    args = parser.parse_args()
    if args.emulate:
        names = [n for n in EMULATED if not args.only or n in args.only.split(",") or n == "full"]
        for lanes in (int(x) for x in args.emulate.split(",")):
            result = emulate(lanes, args.repeats, names)
            classes = list(result["full"])
            print(f"\n{lanes} lane(s): GPU emulation at H200_PROFILE's costs, median of {args.repeats} runs")
            print(f"{'mechanism removed':<20}" + "".join(f"{c:>17}" for c in classes) + "      mean")
            print(f"{'':<20}" + "".join(f"{'ratio  auto/plain':>17}" for _ in classes))
            for name, row in result.items():
                mean = sum(r for r, _, _ in row.values()) / len(row)
                cells = "".join(f"{row[c][0]:7.3f} {row[c][1]:4.0f}/{row[c][2]:<4.0f}" for c in classes)
                print(f"{name:<20}{cells}{mean:10.3f}")
            print("(ratio: auto / plain tok/s by the clock; auto/plain: their Python, CPU µs per token)")
        return
    data = load()
    names = [n for n in VARIANTS if not args.only or n in args.only.split(",") or n in ("full", "model: full")]
    t0 = time.process_time()
    results = {name: speeds(VARIANTS[name], data) for name in names}
    spread: dict[tuple[str, str], float] = {}
    for base in ("full", "model: full"):
        if base not in names:
            continue
        runs = [speeds(VARIANTS[base], data, args.noise, seed) for seed in range(args.seeds)]
        for key in runs[0]:
            values = [r[key] for r in runs]
            spread[(base, *key)] = max(values) - min(values)
    classes = sorted({task for _, task in results["full"]})
    bases = {name: "model: full" if VARIANTS[name].model else "full" for name in names}
    spreads = {base: {k: v for (b, *k2), v in spread.items() if b == base for k in [tuple(k2)]} for base in
               ("full", "model: full") if base in names}  # fmt: skip
    for curve in ("CPU", "H200"):
        table(f"{curve}: replayed, auto / plain by class", results, spreads, classes, curve, bases)
    noisy_names = [n for n in NOISY_VARIANTS if n in names]
    if len(noisy_names) > 1:
        runs = {n: [speeds(VARIANTS[n], data, NOISY, seed) for seed in range(args.seeds)] for n in noisy_names}
        means = {n: {k: sum(r[k] for r in rs) / len(rs) for k in rs[0]} for n, rs in runs.items()}
        sp = {k: max(r[k] for r in runs["full"]) - min(r[k] for r in runs["full"]) for k in runs["full"][0]}
        for curve in ("CPU", "H200"):
            table(f"{curve}: replayed with noise sigma {NOISY}, mean of {args.seeds} seeds", means, {"full": sp},
                  classes, curve, dict.fromkeys(noisy_names, "full"))  # fmt: skip
    if not args.only or "plan reuse" in args.only.split(","):
        bench = load()["bench"][1]
        tasks = ("bench/code-gen", "bench/creative", "bench/math")
        print("\nthe controller's plan and observe, CPU µs a round of plain decoding, median of 3 (H200 curve)")
        print(f"{'mechanism removed':<20}{'lanes':>6}" + "".join(f"{t:>16}" for t in tasks))
        for lanes in (1, 4):
            for name in EMULATED:
                runs = [[controller_time(bench[t], lanes, name) for t in tasks] for _ in range(3)]
                cells = "".join(f"{sorted(r[i] for r in runs)[1]:16.1f}" for i in range(len(tasks)))
                print(f"{name:<20}{lanes:>6}{cells}")
    if not args.only or "loop pricing" in args.only.split(","):
        looped = {name: speeds(v, data) for name, v in LOOP_VARIANTS.items()}
        bases = dict.fromkeys(looped, "loop charged, priced")
        for curve in ("CPU", "H200"):
            per = f"{LOOP[0] * 1e6:.0f} µs a round, {LOOP[1] * 1e6:.0f} µs a drafted row"
            title = f"{curve}: replayed with auto's own {per} charged"
            table(title, looped, {}, classes, curve, bases)
    sim_names = [n for n in SIM_VARIANTS if n in names]
    if sim_names:
        scen = [name for name, *_ in SCENARIOS]
        for pname, profile in SIM_PROFILES.items():
            runs = {n: [simulated(VARIANTS[n], profile, seed) for seed in range(args.seeds)] for n in sim_names}
            means = {n: {("sim", c): sum(r[c] for r in rs) / len(rs) for c in scen} for n, rs in runs.items()}
            base = runs["model: full"]
            sp = {("sim", c): max(r[c] for r in base) - min(r[c] for r in base) for c in scen}
            table(f"{pname}: simulated with a draft model, tok/s, mean of {args.seeds} seeds", means,
                  {"model: full": sp}, scen, "sim", dict.fromkeys(sim_names, "model: full"))  # fmt: skip
    print(f"\n{time.process_time() - t0:.0f} s of CPU")


if __name__ == "__main__":
    main()
