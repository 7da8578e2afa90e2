"""The speed targets over repeated runs: each run's ratio, their median and their minimum (on
this noisy machine one run's ratio is not a figure).

- Single-rate runs (OUT/summary.json): Parallax AUTO over the best baseline per workload; the
  minimum counts against its target (report.AUTO_TARGETS).
- Multi-rate runs (run.py --rate R1 R2 ...: OUT/R/summary.json): per rate and workload, AUTO
  over the best alternative (report.ALTERNATIVES), met when the median is at least 0.97 and no
  run is below 0.90.

    python benchmarks/run.py --workloads lm nmt cnn --systems parallax-hybrid parallax-auto \\
        horovod tf-ps --no-ablation --no-straggler --out DIR_i      (for i = 1, 2, 3)
    python benchmarks/run.py --rate 100mbit 1gbit 10gbit --no-ablation --no-straggler \
        --out DIR_i                                                (or several rates each)
    python benchmarks/repeated.py DIR_1 DIR_2 DIR_3 [--out FILE.md]

- Paired systems (--ratio A/B ...): per rate and workload, each run's throughput of A over
  B's, their median and spread (minimum to maximum). Runs alternate the systems' order
  (run.py --systems in reverse in every other run), so that the machine's drift falls on
  both sides of a pair.

    python benchmarks/repeated.py DIR_1 DIR_2 DIR_3 --ratio parallax-ar@tensorflow/parallax-ar@horovod
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Dict, List, Tuple

import report

MEDIAN_TARGET = 0.97  # AUTO over the best alternative, across link rates
FLOOR = 0.90  # no run below it


def table(folders: List[str]) -> List[str]:
    """A markdown table of the runs in `folders` (run.py's --out of each), single-rate runs'
    or multi-rate runs'."""
    single_rate = [os.path.exists(os.path.join(f, "summary.json")) for f in folders]
    if all(single_rate):
        return _by_workload(folders)
    if any(single_rate):
        raise ValueError("the folders mix single-rate runs (summary.json) and multi-rate "
                         "runs (RATE/summary.json)")
    return _by_rate(folders)


def _by_workload(folders: List[str]) -> List[str]:
    """Each run's Parallax AUTO ratio per workload, their median and minimum."""
    runs = []
    for folder in folders:
        with open(os.path.join(folder, "summary.json")) as summary_file:
            summary = json.load(summary_file)
        runs.append(report.auto_ratios(report.rows_by_workload(summary), summary))
    workloads = [w for w in runs[0] if all(w in run for run in runs)]
    lines = ["| workload | Parallax AUTO over | " + _run_columns(len(runs))
             + " | median | minimum | target | met? |", "|---|---|" + "---|" * (len(runs) + 4)]
    for workload in workloads:
        ratios = [run[workload][0] for run in runs]
        _, goal, label = runs[0][workload]
        lines.append(f"| {workload} | {label} | {_ratio_columns(ratios)} | {goal} | "
                     f"{'met' if min(ratios) >= goal else 'NOT met'} |")
    return lines


def _by_rate(folders: List[str]) -> List[str]:
    """Per rate and workload measured in every run: each run's AUTO over the best
    alternative, their median and minimum, against MEDIAN_TARGET and FLOOR."""
    runs: List[Dict[Tuple[str, str], Tuple[float, str]]] = []
    for folder in folders:
        ratios = {}
        for rate, summary in report.rate_summaries(folder).items():
            for workload, rows in report.rows_by_workload(summary).items():
                ratio = report.auto_over_best(rows)
                if ratio:
                    ratios[rate, workload] = ratio
        runs.append(ratios)
    measured = [key for key in runs[0] if all(key in run for run in runs)]
    if not measured:
        raise ValueError("no rate and workload with AUTO and an alternative in every run")
    lines = ["| link | workload | best alternative | " + _run_columns(len(runs))
             + f" | median | minimum | met? (median >= {MEDIAN_TARGET:.2f}, "
             f"none < {FLOOR:.2f}) |", "|---|---|---|" + "---|" * (len(runs) + 3)]
    for rate, workload in measured:
        ratios = [run[rate, workload][0] for run in runs]
        best = ", ".join(dict.fromkeys(report.SYSTEM_LABELS[run[rate, workload][1]]
                                       for run in runs))
        met = statistics.median(ratios) >= MEDIAN_TARGET and min(ratios) >= FLOOR
        lines.append(f"| {rate} | {workload} | {best} | {_ratio_columns(ratios)} | "
                     f"{'met' if met else 'NOT met'} |")
    return lines


def ratio_table(folders: List[str], pairs: List[Tuple[str, str]]) -> List[str]:
    """Per rate, workload and pair (A, B) measured in every run: each run's throughput of A
    over B's, their median, minimum and maximum."""
    lines = ["| link | workload | ratio | " + _run_columns(len(folders))
             + " | median | spread |", "|---|---|---|" + "---|" * (len(folders) + 2)]
    runs = [_summaries(folder) for folder in folders]
    for rate in runs[0]:
        for workload in report.rows_by_workload(runs[0][rate]):
            for a, b in pairs:
                ratios = []
                for run in runs:
                    rows = report.rows_by_workload(run.get(rate, {"results": []}))
                    over = [report.throughput(rows.get(workload, []), s) for s in (a, b)]
                    ratios.append(over[0] / over[1] if all(over) else None)
                if None in ratios:
                    continue
                label = f"{report.SYSTEM_LABELS[a]} / {report.SYSTEM_LABELS[b]}"
                lines.append(f"| {rate} | {workload} | {label} | "
                             + " | ".join(f"{r:.2f}" for r in ratios)
                             + f" | {statistics.median(ratios):.2f} | "
                             f"{min(ratios):.2f}-{max(ratios):.2f} |")
    if len(lines) == 2:
        raise ValueError("no pair of systems measured in every run")
    return lines


def _summaries(folder: str) -> Dict[str, dict]:
    """The run's summaries by rate: one rate's (folder/summary.json) or several."""
    path = os.path.join(folder, "summary.json")
    if os.path.exists(path):
        with open(path) as summary_file:
            summary = json.load(summary_file)
        return {summary["rate"]: summary}
    return report.rate_summaries(folder)


def _run_columns(runs: int) -> str:
    return " | ".join(f"run {i + 1}" for i in range(runs))


def _ratio_columns(ratios: List[float]) -> str:
    """Each run's ratio, then their median and minimum."""
    return " | ".join(f"{r:.2f}" for r in [*ratios, statistics.median(ratios), min(ratios)])


def _pair(text: str) -> Tuple[str, str]:
    """--ratio's type: two of report.SYSTEM_LABELS's systems."""
    pair = tuple(text.split("/"))
    unknown = [s for s in pair if s not in report.SYSTEM_LABELS]
    if len(pair) != 2 or unknown:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give two systems as A/B, of {sorted(report.SYSTEM_LABELS)}")
    return pair


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", help="run.py's --out of each run")
    parser.add_argument("--out", help="write the table to this markdown file too")
    parser.add_argument("--ratio", nargs="+", metavar="A/B", type=_pair,
                        help="paired systems' throughput ratios instead of AUTO's targets")
    args = parser.parse_args()
    try:
        lines = ratio_table(args.folders, args.ratio) if args.ratio else table(args.folders)
    except ValueError as error:
        parser.error(str(error))
    report.print_and_save(lines, args.out)


if __name__ == "__main__":
    main()
