"""Grading throughput: mathdebate's grader against math-verify called directly.

Baseline (the named one): math-verify 0.9.0 end to end in this process, one check at a time:
``verify(parse("\\boxed{gold}"), parse(response))``, the usage its README gives.
Ours: the env server's path for one turn: ``answers.last_boxed(response)`` then
``Grader.grade(gold, answer)`` (rules, the exact/rational paths and the closed-form path in the
event loop, then the verdict cache, then math-verify in worker processes with parses cached per
worker), all checks of a workload submitted concurrently, as a busy server does. A fresh grader
(cold verdict cache, fresh worker processes, empty parse caches) per run, so no check is answered
from an earlier run; the workers fork from the process's forkserver, which imported math-verify
and warmed its parser on a fixed generic set of answer shapes once (not timed, like ``start()``).

Workloads, from MATH-500 (``../shared/data/math500.jsonl``):
- ``short``: short boxed responses ``So the final answer is $\\boxed{...}$``, one with the
  problem's own answer and one with another problem's answer per problem (1,000, shuffled);
- ``solutions``: every reference solution against its own answer (500);
- ``mismatched``: every reference solution against another problem's answer (500).

And ``written`` (``written_answers.py``): answers written as models write them (other forms of
the same value, units, LaTeX variants, thousands separators, unordered root sets), half right,
against GSM8K test golds and the built-in generator's golds, with the truth known by
construction. For it the script also reports each grader's agreement with the truth, per form,
and every case where math-verify is right and ours is not (the target: none).

Reported per workload: checks/s for the baseline, our single worker and our pool (median of
``--repeats`` runs), the ratio ours/baseline (higher is better), how our grades were decided
(exact / numeric / closed_form / cache / worker) and every verdict that differs from math-verify's, to compare with
the documented policies (README, "Grading policies").

Both sides are warm before anything is timed: math-verify in this process on the workers' own
warm-up shapes (:func:`warm_baseline`), as our workers are warmed before they fork.
``--cold-baseline`` leaves math-verify cold, as sittings before 2026-11-29 did.

Usage: ``python benchmarks/grading.py [--repeats 3] [--workers N] [--cold-baseline]``. Prints a table and, last,
one JSON line (``ours``/``baseline``/``ratio`` are the ``short`` workload with the pool).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from math_verify import parse, verify  # noqa: E402  after the sys.path insert above

from env_server.debate.answers import last_boxed  # noqa: E402  after the sys.path insert above
from env_server.grading.pool import Grader, GradingConfig  # noqa: E402  after the sys.path insert above
from env_server.provenance import provenance  # noqa: E402  after the sys.path insert above

sys.path.insert(0, str(REPO / "benchmarks"))
import written_answers  # noqa: E402  after the sys.path insert above

MATH500 = REPO.parent / "shared" / "data" / "math500.jsonl"


def load_workloads(path: Path, seed: int = 0) -> dict[str, list[tuple[str, str]]]:
    """``name -> [(gold, response)]``."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rng = random.Random(seed)
    others = list(range(len(rows)))
    rng.shuffle(others)
    # a derangement-ish pairing: another problem whose answer differs as a string
    mismatch = {}
    for i, row in enumerate(rows):
        j = others[i]
        while rows[j]["answer"].strip() == row["answer"].strip():
            j = (j + 1) % len(rows)
        mismatch[i] = rows[j]["answer"]
    short = [(r["answer"], f"So the final answer is $\\boxed{{{r['answer']}}}$.") for r in rows]
    short += [(r["answer"], f"So the final answer is $\\boxed{{{mismatch[i]}}}$.") for i, r in enumerate(rows)]
    rng.shuffle(short)
    return {
        "short": short,
        "solutions": [(r["answer"], r["solution"]) for r in rows],
        "mismatched": [(r["answer"], r["solution"].replace(last_boxed(r["solution"]) or "", mismatch[i]))
                       for i, r in enumerate(rows)],
    }


def warm_baseline() -> None:
    """Warm math-verify in this process as our workers are warmed before they fork
    (:func:`env_server.grading.worker.warm_up`): the same generic answer shapes, compared the same
    way, never the workload's data. Without it the baseline's first run pays ANTLR's prediction
    DFA and sympy's caches for every new shape while ours does not, and the ratio depends on how
    many repeats a sitting runs: a run of ``--repeats 1`` measured a cold math-verify (251 checks/s)
    against a warm pool (15.7x), the median of 3 mostly warm runs (433 checks/s, 4.99x).
    """
    from env_server.grading.worker import _WARM_UP_SHAPES as shapes  # the workers' own list: the same warm-up

    for i, gold in enumerate(shapes):
        for answer in (shapes[i - 1], shapes[(i + 7) % len(shapes)], shapes[(i + 31) % len(shapes)]):
            # as in run_baseline: a shape math-verify cannot read is no match, not a failure
            with contextlib.suppress(Exception):
                verify(parse(f"\\boxed{{{gold}}}"), parse(f"$\\boxed{{{answer}}}$"))


def run_baseline(pairs: list[tuple[str, str]]) -> tuple[float, list[bool]]:
    """math-verify end to end, sequential: (checks/s, verdicts)."""
    verdicts = []
    start = time.perf_counter()
    for gold, response in pairs:
        try:
            verdicts.append(bool(verify(parse(f"\\boxed{{{gold}}}"), parse(response))))
        except Exception:
            verdicts.append(False)
    return len(pairs) / (time.perf_counter() - start), verdicts


async def _run_ours(pairs: list[tuple[str, str]], workers: int) -> tuple[float, list[bool], dict[str, int]]:
    grader = Grader(GradingConfig(workers=workers))
    await grader.start()  # starts and warms the workers (not timed: a server does it once)
    try:
        baseline_stats = dict(grader.stats)
        start = time.perf_counter()
        grades = await asyncio.gather(*(grader.grade(gold, last_boxed(response)) for gold, response in pairs))
        rate = len(pairs) / (time.perf_counter() - start)
        sources = {k: v - baseline_stats.get(k, 0) for k, v in grader.stats.items()
                   if k in ("exact", "numeric", "closed_form", "decorated", "cache", "worker", "rule", "deduplicated",
                            "timeouts")}
        return rate, [g.correct for g in grades], sources
    finally:
        grader.close()


def run_ours(pairs: list[tuple[str, str]], workers: int) -> tuple[float, list[bool], dict[str, int]]:
    return asyncio.run(_run_ours(pairs, workers))


def truth_report(cases: list[written_answers.Case], baseline: list[bool], ours: list[bool]) -> dict:
    """Agreement of each grader with the known truth of ``cases``, overall and per written form,
    and the cases where math-verify is right and ours is not; printed and returned."""
    by_form: dict[str, list[int]] = {}  # form -> [cases, math-verify right, ours right]
    worse, better = [], []
    for case, b, o in zip(cases, baseline, ours, strict=True):
        counts = by_form.setdefault(case.form, [0, 0, 0])
        counts[0] += 1
        counts[1] += b == case.truth
        counts[2] += o == case.truth
        if b == case.truth and o != case.truth:
            worse.append(case)
        elif o == case.truth and b != case.truth:
            better.append(case)
    n = len(cases)
    mv_right, ours_right = (sum(c[i] for c in by_form.values()) for i in (1, 2))
    print(f"    truth agreement: math-verify {mv_right}/{n}, ours {ours_right}/{n}; "
          f"ours wrong where math-verify is right: {len(worse)}; ours right where math-verify is wrong: {len(better)}")
    print("    form                 cases  math-verify right  ours right")
    for form, (count, b, o) in sorted(by_form.items(), key=lambda item: -item[1][0]):
        print(f"    {form:20} {count:5d}  {b:17d}  {o:10d}")
    for case in worse[:12]:
        print(f"    ours wrong, math-verify right: gold {case.gold!r} answer {last_boxed(case.response)!r} "
              f"truth {case.truth}")

    def example(c: written_answers.Case) -> dict:
        return {"gold": c.gold, "answer": last_boxed(c.response), "truth": c.truth, "form": c.form}

    return {"truth_agreement": {"math_verify": mv_right, "ours": ours_right, "cases": n},
            "ours_wrong_where_math_verify_right": len(worse),
            "ours_right_where_math_verify_wrong": len(better),
            "worse_examples": [example(c) for c in worse[:20]], "better_examples": [example(c) for c in better[:20]],
            "by_form": {form: {"cases": c, "math_verify_right": b, "ours_right": o}
                        for form, (c, b, o) in by_form.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="pool size")
    parser.add_argument("--problems", type=Path, default=MATH500)
    parser.add_argument("--cold-baseline", action="store_true",
                        help="leave math-verify cold in this process (how sittings before 2026-11-29 measured it)")
    args = parser.parse_args(argv)

    warm_start = time.perf_counter()
    if not args.cold_baseline:
        warm_baseline()
    print(f"math-verify warmed in this process on the workers' warm-up shapes: "
          f"{'no (--cold-baseline)' if args.cold_baseline else f'{time.perf_counter() - warm_start:.1f} s'}")
    workloads = load_workloads(args.problems)
    written = written_answers.cases()
    workloads["written"] = [(c.gold, c.response) for c in written]
    results: dict[str, dict] = {}
    print(f"{'workload':11} {'checks':>6} {'math-verify/s':>14} {'ours 1 worker/s':>16} {'ours pool/s':>12} "
          f"{'ratio 1w':>9} {'ratio pool':>11}  decided by (pool)   verdicts differing")
    for name, pairs in workloads.items():
        base_runs, single_runs, pool_runs = [], [], []
        for _ in range(args.repeats):
            rate, base_verdicts = run_baseline(pairs)
            base_runs.append(rate)
            rate, _, _ = run_ours(pairs, 1)
            single_runs.append(rate)
            rate, our_verdicts, sources = run_ours(pairs, args.workers)
            pool_runs.append(rate)
        base, single, pool = (statistics.median(r) for r in (base_runs, single_runs, pool_runs))
        differ = [(gold, last_boxed(resp), b, o)
                  for (gold, resp), b, o in zip(pairs, base_verdicts, our_verdicts, strict=True) if b != o]
        results[name] = {
            "runs": {"baseline": [round(r, 1) for r in base_runs], "ours_single_worker": [round(r, 1) for r in single_runs],
                     "ours": [round(r, 1) for r in pool_runs]},
            "checks": len(pairs), "baseline": round(base, 1), "ours_single_worker": round(single, 1),
            "ours": round(pool, 1), "ratio_single_worker": round(single / base, 2), "ratio": round(pool / base, 2),
            "decided_by": sources, "differing_verdicts": len(differ),
            "differing_examples": [{"gold": g, "answer": a, "math_verify": b, "ours": o} for g, a, b, o in differ[:8]],
        }
        r = results[name]
        print(f"{name:11} {len(pairs):6d} {base:14.1f} {single:16.1f} {pool:12.1f} {r['ratio_single_worker']:9.2f} "
              f"{r['ratio']:11.2f}  {sources}   {len(differ)}", flush=True)
        print(f"{'':11} runs: math-verify {r['runs']['baseline']}, ours 1 worker {r['runs']['ours_single_worker']}, "
              f"ours pool {r['runs']['ours']}")
        for example in r["differing_examples"]:
            print(f"    differs: gold {example['gold']!r} answer {example['answer']!r}: "
                  f"math-verify {example['math_verify']}, ours {example['ours']}")
        if name == "written":
            r.update(truth_report(written, base_verdicts, our_verdicts))

    print(f"\nmachine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"pool {args.workers} workers; median of {args.repeats} runs")
    short = results["short"]
    print(json.dumps({"ours": short["ours"], "baseline": short["baseline"], "ratio": short["ratio"],
                      "unit": "checks/s", "workload": "short", "workloads": results,
                      "provenance": provenance(vars(args))}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
