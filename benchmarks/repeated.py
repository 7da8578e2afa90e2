"""The speed targets over repeated runs: on this noisy machine a ratio counts when it holds in
every run, so the minimum of the runs is what is reported against the target.

    python benchmarks/run.py --workloads lm nmt cnn --systems parallax-hybrid parallax-auto \
        horovod tf-ps --no-ablation --no-straggler --out DIR_i      (for i = 1, 2, 3)
    python benchmarks/repeated.py DIR_1 DIR_2 DIR_3 [--out FILE.md]
"""
from __future__ import annotations

import argparse
import json
import os
from typing import List

import report


def table(folders: List[str]) -> List[str]:
    """A markdown table: each run's Parallax AUTO ratio per workload, and their minimum."""
    runs = []
    for folder in folders:
        with open(os.path.join(folder, "summary.json")) as summary_file:
            summary = json.load(summary_file)
        runs.append(report.auto_ratios(report.rows_by_workload(summary), summary))
    workloads = [w for w in runs[0] if all(w in run for run in runs)]
    lines = ["| workload | Parallax AUTO over | " + " | ".join(
        f"run {i + 1}" for i in range(len(runs))) + " | minimum | target | met? |",
             "|---|---|" + "---|" * (len(runs) + 3)]
    for workload in workloads:
        ratios = [run[workload][0] for run in runs]
        _, goal, label = runs[0][workload]
        lines.append(f"| {workload} | {label} | " + " | ".join(f"{r:.2f}" for r in ratios)
                     + f" | {min(ratios):.2f} | {goal} | "
                     f"{'met' if min(ratios) >= goal else 'NOT met'} |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", help="run.py's --out of each run")
    parser.add_argument("--out", help="write the table to this markdown file too")
    args = parser.parse_args()
    lines = table(args.folders)
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as out:
            out.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
