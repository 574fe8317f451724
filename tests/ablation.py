"""Each mechanism of auto's controller, lookup forecast and lookup drafter removed in turn, replayed on the recorded
generations (tests/data/qwen_*traces.json) at the recorded decode cost curves: each file's own 2-core CPU curve and
the H200's (``H200_PROFILE``). Prints auto's speed over plain decoding per class with the mechanism and without, and
the replay's own spread: the range of the full controller's speed over noise seeds (the timings it is told carry a
log-normal factor of sigma ``--noise``, as a machine's do). See docs/ablation.md.

    .venv/bin/python tests/ablation.py            # every mechanism
    .venv/bin/python tests/ablation.py --only coverage,substitutions
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgespec.drafters import controller as controller_module  # noqa: E402
from edgespec.drafters import lookup as lookup_module  # noqa: E402
from edgespec.drafters import lookup_forecast  # noqa: E402
from edgespec.drafters.controller import Controller  # noqa: E402
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
from edgespec.drafters.lookup import LookupDrafter  # noqa: E402

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
    """A mechanism removed: controller keyword arguments, module constants patched, a lookup drafter's arguments,
    and whether the replay has a draft model (the draft model's mechanisms only act with one)."""

    controller: dict = field(default_factory=dict)
    patches: list[tuple[object, str, object]] = field(default_factory=list)
    lookup: dict = field(default_factory=dict)
    model: bool = False


VARIANTS: dict[str, Variant] = {
    "full": Variant(),
    "coverage": Variant(patches=[(lookup_forecast, "COPYING_COVERAGE", 2.0)]),
    "after-miss wait": Variant(patches=[(lookup_forecast, "AFTER_MISS", 0)]),
    "bucket lift": Variant(patches=[(lookup_forecast, "LIFT_FROM_BUCKET", 1 << 10)]),
    "agreement buckets": Variant(patches=[(lookup_forecast, "COPYING_COVERAGE", 2.0)], lookup={"_one_bucket": True}),
    "substitutions": Variant(lookup={"learn_substitutions": False}),
    "source choice": Variant(patches=[(lookup_module, "SOURCE_CANDIDATES", 1)]),
    "min_gain margin": Variant(controller={"min_gain": 0.0}),
    "width-change pricing": Variant(controller={"_switch_blind": True}),
    "hiccup clip": Variant(patches=[(controller_module, "HICCUP_CLIP", 1e9)]),
    "plan reuse": Variant(controller={"plan_budget": None}),
    # The draft model's mechanisms, with a draft model in the replay.
    "model: full": Variant(model=True),
    "model: exploration": Variant(controller={"explore": 0.0}, model=True),
    "model: backoff": Variant(controller={"max_backoff": 0}, model=True),
    "model: idle decay": Variant(controller={"idle_decay": 1.0}, model=True),
    "model: catch-up allowance": Variant(controller={"catchup_allowance": 0.0}, model=True),
}
# Mechanisms whose purpose is noisy timings: replayed with noise (sigma NOISY) and averaged over the seeds.
NOISY = 0.25
NOISY_VARIANTS = ("full", "hiccup clip", "min_gain margin")
# The draft model's mechanisms where a draft model can pay: the synthetic GPU profile (not a recorded curve: at the
# recorded ones the draft model loses at any acceptance), on simulate()'s synthetic streams, and the recorded
# profiles for comparison. Scenario: (name, drafters, acceptance by tokens generated, lookup schedule, tokens).
SCENARIOS = [
    ("phase change", ["model"], lambda t: {"model": 0.1 if 2000 <= t < 4000 else 0.9}, 0, 7000),
    ("copy spans", ["model", "lookup"], {"model": 0.7, "lookup": 0.9}, copy_spans(100, 40), 6000),
]
SIM_VARIANTS = ("model: full", "model: exploration", "model: backoff", "model: idle decay", "model: catch-up allowance")
SIM_PROFILES = {"GPU (synthetic)": GPU_PROFILE, "CPU": CPU_PROFILE, "H200": H200_PROFILE}


@contextmanager
def patched(patches: list[tuple[object, str, object]]) -> Iterator[None]:
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    for module, name, value in patches:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


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


class _OneBucket(lookup_forecast.LookupForecast):
    """The forecast with every proposal in one state, whatever its agreement."""

    def offer(self, tokens, agreement=0, from_prompt=False):  # noqa: ANN001, ANN202
        super().offer(tokens, 0, False)


def speeds(variant: Variant, data: dict, noise: float = 0.0, seed: int = 0) -> dict[tuple[str, str], float]:
    """(curve, class) -> auto's speed over plain decoding, one controller a class (as the bench runs them)."""
    out = {}
    kwargs = dict(variant.controller)
    one_bucket = variant.lookup.get("_one_bucket", False)
    switch_blind = kwargs.pop("_switch_blind", False)
    kwargs.setdefault("plan_budget", 0.01)  # the engine's PLAN_BUDGET
    with patched(variant.patches):
        for steps, by_task in data.values():
            for curve in curves(steps):
                for task, traces in by_task.items():
                    drafters = ["model", "lookup"] if variant.model else ["lookup"]
                    ctl = Controller(drafters, max_gamma=MAX_GAMMA, **kwargs)
                    if one_bucket:
                        ctl._lookup = _OneBucket(MAX_GAMMA)
                    verify = {b: curve.cost(b) for b in range(1, MAX_GAMMA + 2)}
                    draft = {"model": curve.draft} if variant.model else {}
                    catchup = {"model": curve.catchup} if variant.model else {}
                    ctl.record_costs(verify, draft, catchup, switch=0.0 if switch_blind else curve.switch)
                    model = SyntheticDraftModel(MODEL_ALPHA, curve.draft, curve.catchup) if variant.model else None
                    lookup_kwargs = {k: v for k, v in variant.lookup.items() if not k.startswith("_")}
                    seconds = 0.0
                    for i, t in enumerate(traces):
                        seconds += replay(
                            ctl, t["prompt"], t["output"], curve.cost, lookup=LookupDrafter(**lookup_kwargs),
                            switch_cost=curve.switch, model=model, noise=noise, seed=seed * 1000 + i,
                        ).seconds  # fmt: skip
                    plain = sum(len(t["output"]) for t in traces) * curve.cost(1)
                    out[(curve.name, task)] = plain / seconds
    return out


def simulated(variant: Variant, profile: CostProfile, seed: int) -> dict[str, float]:
    """Scenario -> tok/s of the controller on simulate()'s synthetic rounds, calibrated as the engine does."""
    out = {}
    noisy = replace(profile, noise=0.05)
    with patched(variant.patches):
        for name, drafters, alphas, lookup_len, n in SCENARIOS:
            ctl = Controller(drafters, **variant.controller)
            model = {"model": profile.draft["model"]}
            ctl.record_costs({b: profile.verify(b) for b in range(1, 10)}, model, dict(profile.catchup))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated mechanisms (default: all)")
    parser.add_argument("--seeds", type=int, default=3, help="noise seeds for the spread")
    parser.add_argument("--noise", type=float, default=0.05, help="sigma of the timings' log-normal factor")
    args = parser.parse_args()
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
