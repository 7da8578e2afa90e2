"""How well AUTO's trials time its plans, from committed runs (run.py's summary.json files whose
AUTO jobs recorded their trials: parallax_job.trials). A plan made by a run option's rule also
runs as that run option's own job in the same run (AR's rule as Parallax AR, and so on; the
cost model's choice has none), so each trial is compared with a job of its plan:

- a plan's step in the trials over its own job's step: how far 15 timed steps, after a
  switch, are from the plan's steady step (what decides which plan AUTO keeps);
- the kept plan's trial step over AUTO's step once kept: the same plan in the same job, a
  minute apart, without the spread between two jobs;
- AUTO's throughput over that of the job of the rule it kept: the same plan minutes apart,
  the spread any comparison of two jobs here has.

    python benchmarks/trial_accuracy.py RUN_FOLDER ... [--out F.md]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
from typing import List, Optional, Sequence

import report


def own_job(plan: str) -> Optional[str]:
    """The system whose job runs `plan` on its own: "PS's rule" -> "parallax-ps"."""
    match = re.fullmatch(r"(\w+)'s rule", plan)
    return f"parallax-{match.group(1).lower()}" if match else None


def jobs(folders: Sequence[str]) -> List[dict]:
    """Every AUTO job with trials under `folders`: its run, rate, workload, its step and its
    trials, and the step of every system of its run and workload."""
    found = []
    for run, summary in report.summaries(folders):
        for workload, rows in report.rows_by_workload(summary).items():
            steps = {row["system"]: row["step_ms"] for row in rows if "step_ms" in row}
            for result in summary["results"]:
                if (result["workload"] != workload or result["system"] != "parallax-auto"
                        or "parallax-auto" not in steps):
                    continue
                chief = next(r for r in result["records"] if r["is_chief"])
                if chief.get("trials"):
                    found.append(dict(run=run, rate=summary["rate"], workload=workload,
                                      auto=steps["parallax-auto"], trials=chief["trials"],
                                      steps=steps))
    return found


def _spread(ratios: List[float]) -> str:
    return (f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}, "
            f"{len(ratios)})" if ratios else "-")


def _rounds(trial: dict) -> str:
    """A plan timed in two rounds (the two nearest): each round's step."""
    rounds = trial.get("rounds_ms") or []
    return " (" + ", ".join(f"{ms:.1f}" for ms in rounds) + ")" if len(rounds) > 1 else ""


def table(found: List[dict]) -> List[str]:
    lines = ["| run | rate | workload | plan | trial (ms) | its own job (ms) | trial / own job |"
             " kept |", "|---|---|---|---|---|---|---|---|"]
    by_plan: dict = {}
    kept_ratios, kept_trial_ratios = [], []
    for job in found:
        for trial in job["trials"]:
            own = job["steps"].get(own_job(trial["plan"]) or "")
            ratio = trial["measured_ms"] / own if own and trial["measured_ms"] else None
            if ratio is not None:
                by_plan.setdefault(trial["plan"], []).append(ratio)
            if trial["kept"]:
                kept_trial_ratios.append(trial["measured_ms"] / job["auto"])
            if trial["kept"] and own:
                kept_ratios.append(own / job["auto"])
            lines.append(
                f"| {os.path.basename(job['run'])} | {job['rate']} | {job['workload']} | "
                f"{trial['plan']} | {trial['measured_ms']:.1f}{_rounds(trial)} | "
                f"{'-' if own is None else f'{own:.1f}'} | "
                f"{'-' if ratio is None else f'{ratio:.2f}'} | {'kept' if trial['kept'] else ''} |")
    lines += ["", "| plan | trial / own job: median (range, trials) |", "|---|---|"]
    lines += [f"| {plan} | {_spread(ratios)} |" for plan, ratios in sorted(by_plan.items())]
    lines += ["", "The kept plan's trial step over AUTO's step once kept: median (range, jobs) "
              f"{_spread(kept_trial_ratios)}",
              "", "AUTO's throughput over that of the job of the rule it kept: median (range, "
              f"jobs) {_spread(kept_ratios)}"]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--out", help="write the tables to this markdown file too")
    args = parser.parse_args()
    found = jobs(args.folders)
    if not found:  # runs before AUTO's chief recorded its trials have none
        parser.error("no AUTO job with recorded trials in the summary.json files under "
                     + " ".join(args.folders))
    report.print_and_save(table(found), args.out)


if __name__ == "__main__":
    main()
