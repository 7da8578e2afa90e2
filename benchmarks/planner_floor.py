"""How often a perfect planner would meet AUTO's speed target on this machine (issue 34: AUTO
over the best alternative, a median of at least 0.97 over 3 runs and no run below 0.90), from
repeated multi-rate runs: the target's floor, which the spread between two jobs of one plan
sets.

A perfect planner keeps, in every run, the plan fastest over all the runs (the alternative of
the highest median throughput). Its job is a job of that plan, but not the plan's own job of
the run, which the target counts among the alternatives:

- "no noise of its own": as if it ran exactly as the plan's own job of the same run, so only
  another plan's job that beat the fastest plan's can lower it (a bound from above: two jobs of
  one plan are never that close);
- "another run's job": the plan's job of another run, over this run's best alternative (a bound
  from below: runs hours apart add the machine's drift to the jobs' own spread);
- with `--repeats`, runs of the same jobs one after the other (run.py once per folder, a few
  minutes apart, as AUTO's job and the plan's own job are in one run): the plan's own job of
  the run times the ratio of two such jobs of the plan, each pair either way round.

Per link and workload: each one's median ratio, minimum or share below 0.90, and the chance
that 3 runs drawn from its ratios meet the target, beside AUTO's measured ratios; last, the
chance that every cell meets it in one set of 3 runs.

    python benchmarks/planner_floor.py RUN_FOLDER ... [--repeats FOLDER ...] [--out F.md]
"""
from __future__ import annotations

import argparse
import itertools
import math
import statistics
from typing import Dict, List, Optional, Sequence, Tuple

import report
from repeated import FLOOR, MEDIAN_TARGET

Cell = Tuple[str, str]  # (rate, workload)


def throughputs(folders: Sequence[str]) -> Dict[Cell, Dict[str, List[float]]]:
    """Per rate and workload, each system's throughput in every run (AUTO and the alternatives
    measured in all of them)."""
    runs = [{(rate, workload): rows for rate, summary in report.rate_summaries(f).items()
             for workload, rows in report.rows_by_workload(summary).items()} for f in folders]
    cells = {}
    for cell in runs[0]:
        per_system = {}
        for system in ["parallax-auto", *report.ALTERNATIVES]:
            rows = [report.fastest(run.get(cell, []), [system]) for run in runs]
            if all(rows):
                per_system[system] = [row["throughput"] for row in rows]
        if "parallax-auto" in per_system and len(per_system) > 1:
            cells[cell] = per_system
    return cells


def second_jobs(folders: Sequence[str]) -> Dict[Tuple[str, str, str], List[float]]:
    """Per rate, workload and system run in several of `folders`, each job's throughput over
    each other's: a second job of a plan against the first, either way round."""
    measured: Dict[Tuple[str, str, str], List[float]] = {}
    for _, summary in report.summaries(folders):
        for workload, rows in report.rows_by_workload(summary).items():
            for system in report.ALTERNATIVES:
                row = report.fastest(rows, [system])
                if row:
                    measured.setdefault((summary["rate"], workload, system), []).append(
                        row["throughput"])
    return {key: [b / a for a, b in itertools.permutations(throughput, 2)]
            for key, throughput in measured.items() if len(throughput) > 1}


def chance_met(ratios: Sequence[float]) -> float:
    """The chance that 3 runs, each a ratio drawn from `ratios`, meet the target: at least two
    at MEDIAN_TARGET or above, and none below FLOOR."""
    above = sum(r >= MEDIAN_TARGET for r in ratios) / len(ratios)
    between = sum(FLOOR <= r < MEDIAN_TARGET for r in ratios) / len(ratios)
    return above ** 3 + 3 * above ** 2 * between


def perfect_planner(per_system: Dict[str, List[float]],
                    second_job: Optional[Dict[str, List[float]]] = None) -> dict:
    """The fastest plan of a cell, and the perfect planner's and AUTO's ratios over the best
    alternative of each run (given a second job's ratios to the first per system, a perfect
    planner with the fastest plan's: "repeat")."""
    alternatives = {s: t for s, t in per_system.items() if s != "parallax-auto"}
    fastest = max(alternatives, key=lambda s: statistics.median(alternatives[s]))
    runs = range(len(per_system[fastest]))
    best = [max(t[i] for t in alternatives.values()) for i in runs]
    return {"fastest": fastest,
            "own": [alternatives[fastest][i] / best[i] for i in runs],
            "other_run": [alternatives[fastest][j] / best[i]
                          for i in runs for j in runs if i != j],
            "repeat": [alternatives[fastest][i] / best[i] * noise
                       for i in runs for noise in (second_job or {}).get(fastest, [])],
            "auto": [per_system["parallax-auto"][i] / best[i] for i in runs]}


def table(folders: Sequence[str], repeats: Sequence[str] = ()) -> List[str]:
    if len(folders) < 2:
        raise ValueError("give at least two runs: a second job of a plan comes from another run")
    cells = throughputs(folders)
    if not cells:
        raise ValueError("no rate and workload with AUTO and an alternative in every run")
    second = second_jobs(repeats)
    lines = [f"A perfect planner against AUTO's target (median >= {MEDIAN_TARGET:.2f} over 3 "
             f"runs, none < {FLOOR:.2f}), from {len(folders)} runs: " + ", ".join(folders)
             + (f"; a second job from {len(repeats)} runs of the same jobs: "
                + ", ".join(repeats) if repeats else ""), "",
             "Chance: that 3 runs, each a ratio drawn from the cell's, meet the target.", "",
             "| link | workload | fastest plan | perfect planner, no noise of its own: median "
             "(min), chance | perfect planner, another run's job: median, share < "
             f"{FLOOR:.2f}, chance | perfect planner, a second job minutes apart: pairs, "
             f"median, share < {FLOOR:.2f}, chance | AUTO: median (min), chance |",
             "|---|---|---|---|---|---|---|"]
    chances: Dict[str, List[float]] = {"own": [], "other_run": [], "repeat": [], "auto": []}
    for (rate, workload), per_system in cells.items():
        found = perfect_planner(per_system, {
            system: ratios for (r, w, system), ratios in second.items()
            if (r, w) == (rate, workload)})
        for key, ratios in found.items():
            if key in chances and ratios:
                chances[key].append(chance_met(ratios))
        pairs = len(found["repeat"]) // len(found["own"])
        repeat = f"{pairs}, {_spread(found['repeat'])}" if pairs else "-"
        lines.append(
            f"| {rate} | {workload} | {report.SYSTEM_LABELS[found['fastest']]} | "
            f"{_least(found['own'])} | {_spread(found['other_run'])} | {repeat} | "
            f"{_least(found['auto'])} |")
    every = {key: math.prod(values) for key, values in chances.items()}
    measured = len(chances["repeat"])
    lines += ["", "Chance that every cell meets the target in one set of 3 runs: perfect "
              f"planner {every['own']:.0%} with no noise of its own, {every['other_run']:.0%} "
              "with another run's job"
              + (f", {every['repeat']:.0%} with a second job minutes apart (the {measured} of "
                 f"{len(cells)} cells measured so)" if measured else "")
              + f"; AUTO {every['auto']:.0%}."]
    return lines


def _least(ratios: List[float]) -> str:
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}), {chance_met(ratios):.0%}"


def _spread(ratios: List[float]) -> str:
    below = sum(r < FLOOR for r in ratios) / len(ratios)
    return f"{statistics.median(ratios):.2f}, {below:.0%}, {chance_met(ratios):.0%}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", help="run.py's --out of each multi-rate run")
    parser.add_argument("--repeats", nargs="*", default=[],
                        help="run.py's --out of runs of the same jobs one after the other")
    parser.add_argument("--out", help="write the report to this markdown file too")
    args = parser.parse_args()
    try:
        lines = table(args.folders, args.repeats)
    except ValueError as error:
        parser.error(str(error))
    report.print_and_save(lines, args.out)


if __name__ == "__main__":
    main()
