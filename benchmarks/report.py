"""The benchmark report: from the workers' records (summary.json, written by run.py) a markdown
table per workload and PNG plots; for a run at several link rates (run.py --rate R1 R2 ...,
each rate's summary in its own folder) rates.md and step_time_vs_rate.png across them. Run
alone it rewrites them from the existing summaries:

    python benchmarks/report.py [benchmarks/results]
"""
from __future__ import annotations

import glob
import json
import math
import os
import re
import statistics
import sys
from typing import Dict, List, Optional, Tuple

import analytic

SYSTEM_LABELS = {
    "single": "1 worker (no network)",
    "parallax-hybrid": "Parallax HYBRID",
    "parallax-ar": "Parallax AR",
    **{f"parallax-{option.lower()}@{library}": f"Parallax {option}, {name}'s collectives"
       for option in ("AR", "HYBRID") for library, name in (("horovod", "Horovod"),
                                                            ("tensorflow", "TensorFlow"))},
    "parallax-ar-own-bn": "Parallax AR, each worker's own batch statistics",
    "parallax-ps": "Parallax PS",
    "parallax-auto": "Parallax AUTO",
    "horovod": "Horovod",
    "horovod-sparse-as-dense": "Horovod sparse_as_dense",
    "tf-ps": "TF-PS (SyncReplicas)",
    "parallax-ps-straggler": "Parallax PS, a straggler",
    "parallax-ps-async-straggler": "Parallax PS async, a straggler",
    "ablation-ps-base": "PS, no optimizations (BASE)",
    "ablation+hybrid": "+HYBRID",
    "ablation+local-aggregation": "+local aggregation",
    "ablation+post-aggregation-placement": "+post-aggregation placement",
    "ablation+boundary": "+boundary placement",
    "ablation+deferred-server-work": "+deferred server work",
}
ABLATION_ORDER = ["ablation-ps-base", "ablation+hybrid", "ablation+local-aggregation",
                  "ablation+post-aggregation-placement", "ablation+boundary",
                  "ablation+deferred-server-work", "parallax-hybrid"]
BASELINES = ["horovod", "horovod-sparse-as-dense", "tf-ps"]
# What Parallax AUTO is measured against across link rates: every other way to train the model.
ALTERNATIVES = ["parallax-hybrid", "parallax-ar", "parallax-ps", *BASELINES]
RATE_SYSTEMS = ["single", "parallax-auto", *ALTERNATIVES]  # rates.md's columns, in order


def rate_bytes_per_second(rate: str) -> float:
    """tc's notation: 100mbit, 1gbit, 500kbit (bits per second)."""
    match = re.fullmatch(r"([0-9.]+)\s*(k|m|g)?bit", rate.strip().lower())
    if not match:
        raise ValueError(f"rate {rate!r}: write it as tc does, e.g. 100mbit or 1gbit")
    scale = {"k": 1e3, "m": 1e6, "g": 1e9, None: 1.0}[match.group(2)]
    return float(match.group(1)) * scale / 8


def _sync_of(result: dict, variables: List[dict]) -> Dict[str, tuple]:
    """How each variable moved in this system's job (analytic.ALLREDUCE/ALLGATHER/PS)."""
    chief = _chief(result)
    placement = chief.get("placement")
    sync = {}
    for variable in variables:
        sparse = variable["rows"] is not None
        server = placement.get(variable["name"]) if placement else None
        if server is not None:
            sync[variable["name"]] = (analytic.PS, server)
        elif chief.get("sync", {}).get(variable["name"]) == analytic.ALLREDUCE:
            sync[variable["name"]] = (analytic.ALLREDUCE, None)  # AUTO: as dense
        elif sparse and not chief.get("sparse_as_dense"):
            sync[variable["name"]] = (analytic.ALLGATHER, None)
        else:
            sync[variable["name"]] = (analytic.ALLREDUCE, None)
    return sync


def _as_placed(variables: List[dict], placement: Dict[str, Optional[int]]) -> List[dict]:
    """The single-device variables as the job stored them: one that Parallax split in k row
    shards (AUTO; parallax/passes/split_variables.py) as its k shards, each with 1/k of its
    bytes, rows and distinct rows (row r is in shard r % k), as the cost model counts them."""
    placed = []
    for variable in variables:
        shards = sorted(name for name in placement
                        if name.startswith(variable["name"] + "/part_"))
        if variable["name"] in placement or not shards:
            placed.append(variable)
            continue
        k = len(shards)
        placed += [dict(variable, name=name, bytes=variable["bytes"] // k,
                        rows=None if variable["rows"] is None else variable["rows"] // k,
                        unique_rows=[u // k for u in variable.get("unique_rows") or []])
                   for name in shards]
    return placed


def _chief(result: dict) -> dict:
    return next(r for r in result["records"] if r["is_chief"])


def _median_throughput(record: dict) -> float:
    steps = record["window_steps"]
    return statistics.median(record["units_per_step"] * steps / s
                             for s in record["window_seconds"])


def summarize(result: dict, single: Optional[dict], summary: dict) -> dict:
    """One row: throughput, speedup, bytes per host link (measured, analytic), link use."""
    row = {"system": result["system"], "error": result["error"]}
    if result["error"] or not result["records"]:
        return row
    chief = _chief(result)
    steps = chief["window_steps"]
    # Asynchronous workers step on their own: the job trains what all of them do.
    throughput = (sum(map(_median_throughput, result["records"]))
                  if chief.get("asynchronous") else _median_throughput(chief))
    row.update(unit=chief["unit"], throughput=throughput, straggler_ms=chief.get("straggler_ms"),
               step_ms=_per_step_ms(chief))
    if chief.get("window_cpu_seconds"):
        row["cpu_ms"] = _per_step_ms(chief, "window_cpu_seconds")
    if chief.get("machine_cpu_after"):  # records from before the meter read it have none
        row.update(machine_cpu(chief))
    if result["system"] == "single":
        row["runs_ms"] = result.get("runs_ms", [row["step_ms"]])
        return row
    if result.get("phases"):
        row["phases"] = result["phases"][0]  # the chief's profiled step
    if single:
        row["speedup"] = row["throughput"] / _median_throughput(_chief(single))
    measured = {}
    for record in result["records"]:  # any worker of a host reads that host's link
        if record["host"] not in measured:
            before, after = record["counters_before"]["eth0"], record["counters_after"]["eth0"]
            total_steps = steps * len(record["window_seconds"])
            measured[record["host"]] = {d: (after[f"{d}_bytes"] - before[f"{d}_bytes"])
                                        / total_steps for d in ("tx", "rx")}
    row["measured"] = [measured[h] for h in sorted(measured)]
    # Table 3 and the cost model describe synchronous steps of equal workers: not a
    # straggler's job, nor an asynchronous one (whose chief's steps are its own).
    if single and not chief.get("straggler_ms") and not chief.get("asynchronous"):
        variables = _as_placed(_chief(single)["variables"], chief.get("placement") or {})
        parallax = chief["system"] == "parallax"
        job = dict(
            variables=variables, sync=_sync_of(result, variables), hosts=summary["hosts"],
            workers_per_host=summary["workers_per_host"],
            unique_pulls=parallax and "boundary_between_workers_and_servers" not in chief["ps_off"],
            summed_pushes=parallax and "local_aggregation" not in chief["ps_off"],
            loop_copies=parallax,
            hierarchical_allreduce=parallax and chief.get("hierarchical_allreduce", False))
        row["job"] = job  # the plan as analytic's functions take it
        row["analytic_phases"] = [list(map(analytic.on_the_wire, phase))
                                  for phase in analytic.host_phase_bytes(**job)]
        row["analytic"] = analytic.both_phases(row["analytic_phases"])
        deviations = [abs(m[d] / a[d] - 1) for m, a in zip(row["measured"], row["analytic"])
                      for d in ("tx", "rx") if a[d]]
        if deviations:  # none on one host: no byte crosses a link
            row["deviation"] = max(deviations)
    busiest = max(m[d] for m in row["measured"] for d in ("tx", "rx"))
    row["link_seconds"] = busiest / rate_bytes_per_second(summary["rate"])
    row["link_bound_ratio"] = row["link_seconds"] / (row["step_ms"] / 1000)
    if single and "analytic" in row:
        # TF-PS pushes what the model's clipping by the global norm made; Parallax clips the
        # aggregate, and pushes each gradient as autodiff made it.
        clipped = chief["system"] == "tf-ps" and chief.get("clips_gradients", False)
        row["predicted_ms"] = predicted_step_ms(row["analytic_phases"], _chief(single), summary,
                                                dict(job, clipped_on_workers=clipped))
        row["prediction_error"] = row["predicted_ms"] / row["step_ms"] - 1
    return row


def predicted_step_ms(analytic_phases: List[List[dict]], single_chief: dict, summary: dict,
                      job: dict) -> float:
    """The step as the cost model predicts it (parallax/cost.py step_time): the pulls, the
    busiest link direction of the first phase at the link rate; the compute and the second
    phase's busiest link direction, whose dense gradients pushed to servers leave as each is
    ready (analytic.pushes), less the updates of the servers' variables, which the busiest
    server does after the pushes; and the waits of the messages and machine stages. The
    compute is one worker's, its CPU time shared by all the workers (every emulated host is on
    this machine's cores; cost.shared_compute); the bytes are Table 3's on the wire (`job`:
    the arguments of analytic.host_phase_bytes and analytic.pushes)."""
    single_ms = _per_step_ms(single_chief)
    # Records from before the meter took CPU time: one core a worker.
    cpu_ms = (_per_step_ms(single_chief, "window_cpu_seconds")
              if single_chief.get("window_cpu_seconds") else single_ms)
    cores = summary.get("cores", os.cpu_count() or 1)
    compute = analytic.cost.shared_compute(
        single_ms, cpu_ms, summary["hosts"] * summary["workers_per_host"], cores) / 1000
    # The servers too share this machine's cores: the busiest one's updates at a worker's
    # speed alone, unless all of them need more CPU than the cores give in that time.
    off, held = analytic.server_updates(**job)
    server_seconds = analytic.cost.shared_compute(
        max(held, default=0.0) * single_ms, sum(held) * cpu_ms, 1, cores) / 1000
    rate = rate_bytes_per_second(summary["rate"])
    pulls, second = ([[link["tx"], link["rx"]] for link in phase] for phase in analytic_phases)
    host, direction = analytic.cost.busiest_link(second)
    payload = analytic.pushes(host=host, direction=("tx", "rx")[direction], **job)
    framed = second[host][direction] / max(sum(nbytes for _, nbytes in payload), 1e-9)
    return 1000 * (analytic.cost.busiest_bytes([pulls]) / rate
                   + analytic.cost.compute_and_pushes(
                       compute, [(ready, nbytes * framed / rate) for ready, nbytes in payload],
                       off, server_seconds)
                   + analytic.waits_seconds(**job))


def machine_cpu(chief: dict) -> dict:
    """The machine's CPU time over the chief's windows: busy ms a step (every host's workers,
    servers and network on the shared cores), and the share of the cores busy; near 1, the
    step is bound by the cores, whatever the link."""
    before, after = chief["machine_cpu_before"], chief["machine_cpu_after"]
    spent = {kind: after[kind] - before[kind] for kind in ("busy", "idle", "steal")}
    steps = chief["window_steps"] * len(chief["window_seconds"])
    return {"machine_cpu_ms": 1000 * spent["busy"] / steps,
            "cores_busy": spent["busy"] / max(sum(spent.values()), 1e-9)}


def _per_step_ms(chief: dict, key: str = "window_seconds") -> float:
    """A worker's median window of `key` (seconds), per step, in ms."""
    return 1000 * statistics.median(chief[key]) / chief["window_steps"]


def rows_by_workload(summary: dict) -> Dict[str, List[dict]]:
    by_workload: Dict[str, List[dict]] = {}
    for result in summary["results"]:
        by_workload.setdefault(result["workload"], []).append(result)
    rows = {}
    for workload, results in by_workload.items():
        measured = [r for r in results if r["system"] == "single" and not r["error"]]
        single = None
        if measured:  # one row for the runs of one worker alone
            single = one_worker(measured)
            results = [single] + [r for r in results if r["system"] != "single"]
        rows[workload] = [summarize(r, single, summary) for r in results]
    return rows


def print_and_save(lines: List[str], path: Optional[str]) -> None:
    """A tool's markdown report on stdout, and in the file `path` too where given."""
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if path:
        with open(path, "w") as out:
            out.write(text)


def one_worker(singles: List[dict]) -> dict:
    """A workload's measurements of one worker alone (run.py: before and after its other
    jobs, as this machine's speed drifts) as one result: the windows of all of them."""
    chiefs = [_chief(result) for result in singles]
    merged = dict(chiefs[0], window_seconds=[s for c in chiefs for s in c["window_seconds"]])
    if all(c.get("window_cpu_seconds") for c in chiefs):
        merged["window_cpu_seconds"] = [s for c in chiefs for s in c["window_cpu_seconds"]]
    else:  # a record from before the meter took CPU time
        merged.pop("window_cpu_seconds", None)
    return dict(singles[0], records=[merged], runs_ms=[_per_step_ms(c) for c in chiefs])


def _mb(value: float) -> str:
    return f"{value / 1e6:.2f}"


def _table(rows: List[dict]) -> List[str]:
    lines = ["| system | throughput | step (ms) | speedup over 1 worker | "
             "MB/step per host link, measured tx/rx | analytic (Table 3, on the wire) tx/rx | "
             "max deviation | link-busy share of the step | machine CPU ms/step (cores busy) "
             "| predicted step (ms), error |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        label = SYSTEM_LABELS.get(row["system"], row["system"])
        if row["error"]:
            lines.append(f"| {label} | failed: {row['error']} | | | | | | | | |")
            continue
        measured = " ; ".join(f"{_mb(m['tx'])}/{_mb(m['rx'])}" for m in row.get("measured", []))
        expected = " ; ".join(f"{_mb(a['tx'])}/{_mb(a['rx'])}" for a in row.get("analytic", []))
        deviation = f"{100 * row['deviation']:.1f}%" if "deviation" in row else ""
        busy = f"{row['link_bound_ratio']:.2f}" if "link_bound_ratio" in row else ""
        cores = (f"{row['machine_cpu_ms']:.0f} ({row['cores_busy']:.0%})"
                 if "machine_cpu_ms" in row else "")
        speedup = f"{row['speedup']:.2f}x" if "speedup" in row else ""
        predicted = (f"{row['predicted_ms']:.0f}, {100 * row['prediction_error']:+.0f}%"
                     if "predicted_ms" in row else "")
        lines.append(f"| {label} | {row['throughput']:.0f} {row['unit']}/s | "
                     f"{row['step_ms']:.0f} | {speedup} | {measured} | {expected} | "
                     f"{deviation} | {busy} | {cores} | {predicted} |")
    return lines


def _row(rows: List[dict], system: str) -> Optional[dict]:
    """The system's row, if it ran and did not fail."""
    return next((r for r in rows if r["system"] == system and not r["error"]), None)


def throughput(rows: List[dict], system: str) -> Optional[float]:
    """The system's throughput, if it ran and did not fail."""
    row = _row(rows, system)
    return row["throughput"] if row else None


def fastest(rows: List[dict], systems: List[str]) -> Optional[dict]:
    """The row of the highest throughput of `systems` that ran and did not fail."""
    ran = [row for row in (_row(rows, s) for s in systems) if row]
    return max(ran, key=lambda row: row["throughput"], default=None)


def auto_over_best(rows: List[dict]) -> Optional[Tuple[float, str]]:
    """Parallax AUTO's throughput over the best alternative's (ALTERNATIVES), and which one."""
    auto, best = throughput(rows, "parallax-auto"), fastest(rows, ALTERNATIVES)
    return (auto / best["throughput"], best["system"]) if auto and best else None


# Parallax AUTO's throughput over the best baseline's (over Horovod's on cnn): the targets on
# 2 hosts x 2 workers, and on lm over 4 hosts x 1 worker.
AUTO_TARGETS = {"lm": 2.3, "nmt": 1.8, "cnn": 0.97}
AUTO_TARGET_4X1 = {"lm": 3.0}


def auto_ratios(rows: Dict[str, List[dict]], summary: dict) -> Dict[str, tuple]:
    """Per workload with a target: (AUTO / baseline, the target, the baseline's label)."""
    shape = (summary["hosts"], summary["workers_per_host"])
    goals = {(2, 2): AUTO_TARGETS, (4, 1): AUTO_TARGET_4X1}.get(shape, {})
    ratios = {}
    for workload, goal in goals.items():
        baselines = ["horovod"] if workload == "cnn" else BASELINES
        auto = throughput(rows.get(workload, []), "parallax-auto")
        best = fastest(rows.get(workload, []), baselines)
        if auto and best:
            label = "Horovod" if workload == "cnn" else "the best of Horovod and TF-PS"
            ratios[workload] = (auto / best["throughput"], goal, label)
    return ratios


def targets(rows: Dict[str, List[dict]], transform: Optional[dict],
            summary: dict) -> List[str]:
    lines = []
    for workload, (ratio, goal, label) in auto_ratios(rows, summary).items():
        lines.append(f"- {workload}: Parallax AUTO / {label} = {ratio:.2f} (target >= {goal}, "
                     f"the minimum of 3 runs counts: benchmarks/repeated.py): "
                     f"{'met' if ratio >= goal else 'NOT met'} in this run")
    if "lm" in rows:
        hybrid = throughput(rows["lm"], "parallax-hybrid")
        best = fastest(rows["lm"], BASELINES)
        if hybrid and best:
            lines.append(f"- (b) lm: Parallax HYBRID / best of Horovod and TF-PS = "
                         f"{hybrid / best['throughput']:.2f} (target >= 2): "
                         f"{'met' if hybrid >= 2 * best['throughput'] else 'NOT met'}")
        measured = [r for r in rows["lm"] if "link_bound_ratio" in r and not r["straggler_ms"]]
        single = next((r for r in rows["lm"] if r["system"] == "single" and not r["error"]), None)
        if measured and single:
            slowest = max(measured, key=lambda r: r["step_ms"])
            lines.append(f"- the link rate: on (b) lm the slowest system "
                         f"({SYSTEM_LABELS[slowest['system']]}, {slowest['step_ms']:.0f} ms a "
                         f"step) has its busiest link busy {slowest['link_bound_ratio']:.0%} of "
                         f"the step (target >= 50%); one worker computes a step in "
                         f"{single['step_ms']:.0f} ms")
        synchronous, asynchronous = (throughput(rows["lm"], s) for s in (
            "parallax-ps-straggler", "parallax-ps-async-straggler"))
        if synchronous and asynchronous:
            delay = next(r["straggler_ms"] for r in rows["lm"]
                         if r["system"] == "parallax-ps-straggler")
            ratio = asynchronous / synchronous
            lines.append(f"- lm with a straggler (the last worker {delay:.0f} ms slower a "
                         f"step): PS asynchronous / synchronous = {ratio:.2f} (async should "
                         f"win): {'met' if ratio > 1 else 'NOT met'}")
    if "cnn" in rows:
        hybrid, horovod = (throughput(rows["cnn"], s) for s in ("parallax-hybrid", "horovod"))
        if hybrid and horovod:
            lines.append(f"- (a) cnn: Parallax HYBRID / Horovod = {hybrid / horovod:.3f} "
                         f"(target >= 0.97): {'met' if hybrid >= 0.97 * horovod else 'NOT met'}")
    deviations = [(w, r["system"], r["deviation"]) for w, rs in rows.items() for r in rs
                  if "deviation" in r and not r["system"].startswith("ablation")]
    if deviations:
        worst = max(deviations, key=lambda d: d[2])
        within = sum(d[2] <= 0.05 for d in deviations)
        lines.append(f"- measured bytes within 5% of the analytic figure: {within} of "
                     f"{len(deviations)} jobs (every system and mode); worst "
                     f"{100 * worst[2]:.1f}% ({SYSTEM_LABELS.get(worst[1], worst[1])} on "
                     f"{worst[0]}). The ablation stages are left out: with an optimization "
                     "off, the traffic it removes is what the difference shows.")
    errors = [(w, r["system"], r["prediction_error"]) for w, rs in rows.items() for r in rs
              if "prediction_error" in r and not r["system"].startswith("ablation")]
    if errors:
        within = sum(abs(e[2]) <= 0.15 for e in errors)
        mean_accuracy = 1 - statistics.mean(abs(e[2]) for e in errors)
        worst = max(errors, key=lambda e: abs(e[2]))
        lines.append(f"- predicted step time (cost model) within 15% of the "
                     f"measured one: {within} of {len(errors)} jobs, mean accuracy "
                     f"{100 * mean_accuracy:.1f}% (ParaDL: 86.74%); worst "
                     f"{100 * worst[2]:+.0f}% ({SYSTEM_LABELS.get(worst[1], worst[1])} on "
                     f"{worst[0]}); every job in prediction.png")
    if transform:
        slowest = max(transform["seconds"].values())
        lines.append(f"- transforming {transform['model']} ({transform['ops']} ops, "
                     f"{transform['variables']} variables): "
                     + ", ".join(f"{k} {v:.2f} s" for k, v in transform["seconds"].items())
                     + f" (target < 3 s): {'met' if slowest < 3 else 'NOT met'}")
    return lines


def _phase_table(rows: List[dict]) -> List[str]:
    phases = ["input", "pull", "push", "server", "allreduce", "wait_for_chief", "compute"]
    lines = ["| system | traced step (ms) | " + " | ".join(phases) + " |",
             "| --- | --- | " + " | ".join("---" for _ in phases) + " |"]
    for row in rows:
        record = row["phases"]
        lines.append(f"| {SYSTEM_LABELS.get(row['system'], row['system'])} | "
                     f"{record['run_ms']:.0f} | "
                     + " | ".join(f"{record[p + '_ms']:.0f}" for p in phases) + " |")
    return lines


def _cluster(summary: dict) -> str:
    return (f"{summary['hosts']} hosts x {summary['workers_per_host']} workers (network "
            f"namespaces on one 2-core machine)")


def _longer_windows(summary: dict) -> str:
    """The workloads whose windows were longer than --window (run.MIN_WINDOW_STEPS)."""
    longer = summary.get("min_window_steps") or {}
    return "".join(f"; {workload}: windows of at least {steps} steps"
                   for workload, steps in sorted(longer.items()))


def write(summary: dict, out: str) -> None:
    rows = rows_by_workload(summary)
    transform = summary.get("transform")
    lines = ["# Parallax benchmark", "",
             f"{_cluster(summary)}, each host's link limited to {summary['rate']} "
             f"both ways{', delay ' + summary['delay'] if summary.get('delay') else ''}. "
             f"Measurement: {' '.join(summary['measure'])}{_longer_windows(summary)} "
             "(warm-up steps, then windows of steps; throughput is the median window of the chief). Bytes are each host's "
             "interface counters over the windows, per step; 'link-busy share' is the busiest "
             "direction's bytes at the link rate over the step time (the ratio of measured "
             "throughput to the link-bandwidth bound); 'machine CPU' is the busy CPU time of "
             "the machine's cores, which every emulated host shares, over the chief's windows, "
             "per step, and the share of the cores it kept busy.", ""]
    lines += ["## Targets", ""] + targets(rows, transform, summary) + [""]
    for workload, workload_rows in rows.items():
        single = next((r for r in workload_rows if r["system"] == "single"), None)
        lines += [f"## {workload}", ""]
        if single and not single["error"]:
            cpu = (f", {single['cpu_ms']:.0f} ms of CPU time on {summary.get('cores')} cores"
                   if "cpu_ms" in single else "")
            runs = (" (the median of its windows measured before and after the other jobs, "
                    "whose medians were " + " and ".join(f"{ms:.0f}" for ms in single["runs_ms"])
                    + " ms)" if len(single["runs_ms"]) > 1 else "")
            lines.append(f"One worker alone, compute only: {single['step_ms']:.0f} ms a step "
                         f"({single['throughput']:.0f} {single['unit']}/s{cpu}){runs}.")
            lines.append("")
        main = [r for r in workload_rows if not r["system"].startswith("ablation")]
        lines += _table(main) + [""]
        profiled = [r for r in main if "phases" in r]
        if profiled:
            lines += [f"Where the chief's step goes ({workload}; its last warm-up step, traced: "
                      "the time during which some op of each phase ran, phases overlapping "
                      "as the runtime overlaps them; parallax/profile.py):", ""]
            lines += _phase_table(profiled) + [""]
        ablation = [r for s in ABLATION_ORDER for r in workload_rows if r["system"] == s]
        if len(ablation) > 1:
            lines += [f"Table 4 ablation ({workload}):", ""] + _table(ablation) + [""]
    with open(os.path.join(out, "results.md"), "w") as out_file:
        out_file.write("\n".join(lines) + "\n")
    _plots(rows, out)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _plots(rows: Dict[str, List[dict]], out: str) -> None:
    plt = _pyplot()
    for workload, workload_rows in rows.items():
        figure, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
        shown = [r for r in workload_rows if not r["error"]]
        labels = [SYSTEM_LABELS.get(r["system"], r["system"]) for r in shown]
        left.barh(labels, [r["throughput"] for r in shown], color="tab:blue")
        left.set_xlabel(f"{shown[0]['unit'] if shown else ''} per second")
        left.set_title(f"{workload}: throughput")
        left.invert_yaxis()
        with_bytes = [r for r in shown if "analytic" in r]
        names = [SYSTEM_LABELS.get(r["system"], r["system"]) for r in with_bytes]
        busiest = [max(m[d] for m in r["measured"] for d in ("tx", "rx")) / 1e6
                   for r in with_bytes]
        expected = [max(a[d] for a in r["analytic"] for d in ("tx", "rx")) / 1e6
                    for r in with_bytes]
        positions = range(len(with_bytes))
        right.barh([p - 0.2 for p in positions], busiest, height=0.4, label="measured")
        right.barh([p + 0.2 for p in positions], expected, height=0.4, label="Table 3")
        right.set_yticks(list(positions), names)
        right.set_xscale("log")
        right.set_xlabel("MB per step, busiest host link direction")
        right.set_title(f"{workload}: bytes per step")
        right.invert_yaxis()
        right.legend()
        figure.tight_layout()
        figure.savefig(os.path.join(out, f"{workload}.png"), dpi=110)
        plt.close(figure)
    _prediction_plot(plt, rows, out)


def _prediction_plot(plt, rows: Dict[str, List[dict]], out: str) -> None:
    """prediction.png: the cost model's step time against the measured one, every job."""
    jobs = [(workload, r) for workload, rs in rows.items() for r in rs
            if "predicted_ms" in r and not r["system"].startswith("ablation")]
    if not jobs:
        return
    figure, axes = plt.subplots(figsize=(7, 6))
    styles = {workload: (marker, f"C{index}")
              for index, (workload, marker) in enumerate(zip(rows, "osD^vP*X"))}
    for workload, row in jobs:
        marker, color = styles[workload]
        axes.scatter(row["step_ms"], row["predicted_ms"], marker=marker, color=color,
                     label=workload)
        axes.annotate(SYSTEM_LABELS.get(row["system"], row["system"]),
                      (row["step_ms"], row["predicted_ms"]), fontsize=7,
                      xytext=(4, 2), textcoords="offset points")
    low = min(min(r["step_ms"], r["predicted_ms"]) for _, r in jobs) / 1.5
    high = max(max(r["step_ms"], r["predicted_ms"]) for _, r in jobs) * 1.5
    axes.plot([low, high], [low, high], color="black", linewidth=0.8)
    axes.fill_between([low, high], [0.85 * low, 0.85 * high], [1.15 * low, 1.15 * high],
                      color="gray", alpha=0.2, label="within 15%")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("measured step (ms)")
    axes.set_ylabel("predicted step (ms): pulls, compute and pushes, waits")
    axes.set_title("Cost model: predicted against measured step time")
    handles, labels = axes.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    axes.legend(unique.values(), unique.keys())
    figure.tight_layout()
    figure.savefig(os.path.join(out, "prediction.png"), dpi=110)
    plt.close(figure)


def rate_summaries(folder: str) -> Dict[str, dict]:
    """A run at several link rates (run.py --rate R1 R2 ...: folder/R/summary.json) by rate,
    the slowest first."""
    summaries = {}
    for path in glob.glob(os.path.join(folder, "*", "summary.json")):
        with open(path) as summary_file:
            summary = json.load(summary_file)
        summaries[summary["rate"]] = summary
    return dict(sorted(summaries.items(), key=lambda item: rate_bytes_per_second(item[0])))


def _by_rate(summaries: Dict[str, dict]) -> Tuple[Dict[str, Dict[str, List[dict]]], List[str]]:
    """Each rate's rows by workload, and every workload measured at some rate."""
    rows = {rate: rows_by_workload(summary) for rate, summary in summaries.items()}
    return rows, list(dict.fromkeys(w for by_workload in rows.values() for w in by_workload))


def rates_report(summaries: Dict[str, dict]) -> List[str]:
    """rates.md: per workload, a row per link rate with every system's step time, Parallax
    AUTO over the best alternative, and AUTO's predicted step against its measured one."""
    rows, workloads = _by_rate(summaries)
    first = next(iter(summaries.values()))
    lines = ["# Parallax benchmark: step time against link speed", "",
             f"{_cluster(first)}, each host's link limited to each rate in turn (each rate's "
             "report in its folder, RATE/results.md). Step: the chief's median window, per "
             "step, in ms. AUTO / best alternative: Parallax AUTO's throughput over the best of "
             + ", ".join(SYSTEM_LABELS[s] for s in ALTERNATIVES) + " that ran and did not "
             "fail. Predicted: AUTO's step as the cost model predicts it, and its error.", ""]
    for workload in workloads:
        ran = {r["system"] for by_workload in rows.values() for r in by_workload.get(workload, [])}
        systems = [s for s in RATE_SYSTEMS if s in ran]
        lines += [f"## {workload}", "",
                  "| link | " + " | ".join(SYSTEM_LABELS[s] for s in systems)
                  + " | AUTO / best alternative | best alternative | AUTO predicted (ms), "
                  "error |", "|---|" + "---|" * (len(systems) + 3)]
        for rate, by_workload in rows.items():
            workload_rows = by_workload.get(workload)
            if not workload_rows:  # not measured at this rate
                continue
            steps = [_step_cell(workload_rows, s) for s in systems]
            ratio = auto_over_best(workload_rows)
            best = (f"{ratio[0]:.2f} | {SYSTEM_LABELS[ratio[1]]}" if ratio else " | ")
            auto = _row(workload_rows, "parallax-auto") or {}
            predicted = (f"{auto['predicted_ms']:.0f} against {auto['step_ms']:.0f}, "
                         f"{100 * auto['prediction_error']:+.0f}%"
                         if "predicted_ms" in auto else "")
            lines.append(f"| {rate} | " + " | ".join(steps) + f" | {best} | {predicted} |")
        lines.append("")
    return lines


def _step_cell(rows: List[dict], system: str) -> str:
    row = next((r for r in rows if r["system"] == system), None)
    if row is None:
        return ""
    return "failed" if row["error"] else f"{row['step_ms']:.0f}"


def write_rates(summaries: Dict[str, dict], out: str) -> None:
    """rates.md and step_time_vs_rate.png in `out` for the summaries by rate."""
    with open(os.path.join(out, "rates.md"), "w") as out_file:
        out_file.write("\n".join(rates_report(summaries)) + "\n")
    rows, workloads = _by_rate(summaries)
    speeds = [8 * rate_bytes_per_second(rate) for rate in rows]
    plt = _pyplot()
    columns = min(len(workloads), 3)
    panel_rows = math.ceil(len(workloads) / columns)
    width, legend_width = 5 * columns, 2  # inches
    figure, axes = plt.subplots(panel_rows, columns, squeeze=False,
                                figsize=(width + legend_width, 4 * panel_rows))
    for panel, workload in zip(axes.flat, workloads):
        for index, system in enumerate(RATE_SYSTEMS):
            points = [(speed, row["step_ms"]) for speed, by_workload in zip(speeds, rows.values())
                      if (row := _row(by_workload.get(workload, []), system))]
            if points:  # AUTO drawn over the plan it often shares with HYBRID
                style = (dict(color="black", linewidth=2.5, zorder=3)
                         if system == "parallax-auto" else dict(color=f"C{index}"))
                panel.plot(*zip(*points), marker="o", label=SYSTEM_LABELS[system], **style)
        # Steps span two orders of magnitude (sparse_as_dense against AUTO).
        panel.set_xscale("log")
        panel.set_yscale("log")
        panel.set_xticks(speeds, list(rows))
        panel.set_xticks([], minor=True)
        panel.set_xlabel("each host's link, both ways")
        panel.set_ylabel("step (ms)")
        panel.set_title(workload)
    for panel in axes.flat[len(workloads):]:
        panel.set_visible(False)
    labelled = {label: handle for panel in axes.flat
                for handle, label in zip(*panel.get_legend_handles_labels())}
    figure.legend(labelled.values(), labelled.keys(), loc="center right", fontsize=8)
    figure.tight_layout(rect=(0, 0, width / (width + legend_width), 1))
    figure.savefig(os.path.join(out, "step_time_vs_rate.png"), dpi=110)
    plt.close(figure)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__),
                                                             "results")
    if os.path.exists(os.path.join(out, "summary.json")):
        with open(os.path.join(out, "summary.json")) as summary:
            write(json.load(summary), out)
        print(os.path.join(out, "results.md"))
        return
    summaries = rate_summaries(out)
    if not summaries:
        sys.exit(f"{out}: no summary.json, nor RATE/summary.json")
    for rate, summary in summaries.items():
        write(summary, os.path.join(out, rate))
    write_rates(summaries, out)
    print(os.path.join(out, "rates.md"))


if __name__ == "__main__":
    main()
