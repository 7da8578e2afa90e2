"""How near a prediction of the step can come on this machine, from committed runs (run.py's
summary.json files), per group of link rates:

- the cost model's own error (report.predicted_step_ms, every job but the ablation's);
- the floor the machine's repeatability leaves: each job predicted by the median of the same
  job's other runs (same workload, system and rate): the spread a prediction made before
  the job cannot be expected to beat;
- what the model misses, fitted as a cost per step of each way of synchronizing (Horovod's
  allreduce and allgather, Parallax's servers, TF-PS's) per variable and per byte moved,
  beyond the model's step (issue 34's item 1): in sample; each workload predicted by a fit
  of the others only; each system predicted by a fit of the other systems of its run and
  workload (as AUTO would, calibrating on its trials' plans and predicting another).

    python benchmarks/prediction_fit.py RUN_FOLDER ... [--rates 1gbit,10gbit ...] [--out F.md]
"""
from __future__ import annotations

import argparse
import statistics
from typing import List, Sequence

import numpy as np

import analytic
import report

WITHIN = 0.15  # issue 34: the predicted step within 15% of the measured one


def jobs(folders: Sequence[str]) -> List[dict]:
    """Every predicted job of the summary.json files under `folders`: its run (the folder of
    its summary, or of its rates), rate, workload, system, measured and predicted step, and
    per way of synchronizing its (variables, bytes on all links a step)."""
    found = []
    for run, summary in report.summaries(folders):
        for workload, rows in report.rows_by_workload(summary).items():
            for row in rows:
                if "predicted_ms" not in row or row["system"].startswith("ablation"):
                    continue
                kinds = analytic.by_method(**row["job"])
                if row["system"] == "tf-ps":  # its own servers, not Parallax's
                    kinds = {("TF-PS " if kind == str(analytic.PS) else "") + kind: value
                             for kind, value in kinds.items()}
                found.append(dict(run=run, rate=summary["rate"], workload=workload,
                                  system=row["system"], step=row["step_ms"],
                                  predicted=row["predicted_ms"], kinds=kinds))
    return found


def hits(errors: Sequence[float]) -> str:
    if not errors:
        return "-"
    share = float(np.mean([abs(e) <= WITHIN for e in errors]))
    return f"{share:.0%} (median error {statistics.median(map(abs, errors)):.0%})"


def floor_errors(group: List[dict]) -> List[float]:
    """Each job's step predicted by the median of the same job's other runs."""
    errors = []
    for job in group:
        others = [o["step"] for o in group if o is not job and _same_job(o, job)]
        if others:
            errors.append(statistics.median(others) / job["step"] - 1)
    return errors


def _same_job(a: dict, b: dict) -> bool:
    return (a["rate"], a["workload"], a["system"]) == (b["rate"], b["workload"], b["system"])


def columns(group: List[dict]) -> List[str]:
    kinds = sorted({kind for job in group for kind in job["kinds"]})
    return [f"{kind}: ms a variable" for kind in kinds] + [f"{kind}: ms a MB" for kind in kinds]


def _features(job: dict, names: List[str]) -> List[float]:
    values = []
    for name in names:
        kind, unit = name.split(": ")
        count, nbytes = job["kinds"].get(kind, (0, 0.0))
        values.append(count if unit == "ms a variable" else nbytes / 1e6)
    return values


def fit(train: List[dict], names: List[str]) -> np.ndarray:
    """Least squares of each job's step beyond the model's on its features."""
    features = np.array([_features(job, names) for job in train])
    missed = np.array([job["step"] - job["predicted"] for job in train])
    return np.linalg.lstsq(features, missed, rcond=None)[0]


def fitted_errors(group: List[dict], names: List[str], held_out: str = "") -> List[float]:
    """The errors of the model plus the fitted costs: fitted on the whole group; or, with
    `held_out` "workload", each workload's jobs on a fit of the others'; with "system", each
    job on a fit of the other systems of its run and workload."""
    errors = []
    for job in group:
        if held_out == "workload":
            train = [j for j in group if j["workload"] != job["workload"]]
        elif held_out == "system":
            train = [j for j in group if j is not job and (j["run"], j["workload"]) == (
                job["run"], job["workload"]) and j["system"] != job["system"]]
        else:
            train = group
        if train:  # else nothing to fit it on
            missed = float(np.dot(_features(job, names), fit(train, names)))
            errors.append((job["predicted"] + missed) / job["step"] - 1)
    return errors


def table(found: List[dict], rate_groups: Sequence[Sequence[str]]) -> List[str]:
    lines = [f"Predicted step within {WITHIN:.0%} of the measured one (share of jobs):", "",
             "| rates | jobs | cost model | floor: the same job's other runs | model + fitted "
             "costs, in sample | same, each workload left out of the fit | same, each system "
             "left out of its run's fit |", "|---|---|---|---|---|---|---|"]
    fitted = []
    for rates in rate_groups:
        group = [job for job in found if job["rate"] in rates]
        if not group:
            continue
        names = columns(group)
        lines.append(f"| {', '.join(rates)} | {len(group)} | "
                     + hits([j["predicted"] / j["step"] - 1 for j in group]) + " | "
                     + hits(floor_errors(group)) + " | "
                     + " | ".join(hits(fitted_errors(group, names, held_out))
                                  for held_out in ("", "workload", "system")) + " |")
        fitted.append(f"- {', '.join(rates)}: " + ", ".join(
            f"{name} {value:.2f}" for name, value in zip(names, fit(group, names))))
    return lines + ["", "Costs fitted in sample (beyond the model's step):", *fitted]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--rates", nargs="+", default=["100mbit", "1gbit,10gbit"],
                        help="groups of rates, each fitted on its own (comma-separated)")
    parser.add_argument("--out", help="write the report to this markdown file too")
    args = parser.parse_args()
    found = jobs(args.folders)
    if not found:
        parser.error("no predicted job in the summary.json files under " + " ".join(args.folders))
    report.print_and_save(table(found, [group.split(",") for group in args.rates]), args.out)


if __name__ == "__main__":
    main()
