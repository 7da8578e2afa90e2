"""`python -m parallax.plan SCRIPT [ARGS] --machines M --workers-per-machine W --link RATE`:
what each run option's plan would cost on a cluster you may not have. The script runs up to
its parallax.get_runner, which launches nothing: it measures on this machine what the plans
depend on (each sparse gradient's rows and alpha, one worker's step alone unless --step-ms
gives it) and answers, for AR, PS, HYBRID and AUTO, each variable's method and server, the
bytes on the busiest link direction, the predicted step and throughput, and the term that
bounds the step. --resources R plans for those machines instead, their links probed.

Exit status: 0 answered, 2 not answered (the script failed or never called get_runner).
Options may come anywhere; an argument of the script's with the same name goes after `--`.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

from parallax import contracts, script_command
from parallax.planning import explanation
from parallax.planning.cost import PS, Method
from parallax.planning.query import Answer, FedSteps, PlanShown

NOT_ANSWERED = 2
_RATE = re.compile(r"^\s*([0-9.]+(?:e[0-9]+)?)\s*([kmgt]?)(bit|b)(?:/?s|ps)?\s*$", re.I)
_PREFIX = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def rate(text: str) -> float:
    """Bytes a second of a link rate as people write it: 10gbit, 100Mbit/s, 1.25GB/s."""
    match = _RATE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a rate: write it as 100mbit, 10gbit or 1.25GB/s")
    value = float(match.group(1)) * _PREFIX[match.group(2).lower()]
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a rate must be more than 0, got {text!r}")
    in_bytes = match.group(3) == "B"  # 1.25GB/s; 100Mb, 100mbit: bits
    return value if in_bytes else value / 8


def ask(script: str, arguments: Sequence[str], query: contracts.PlanQuery
        ) -> Tuple[Optional[Answer], str]:
    """The script's answer to `query` (query.out is replaced by a file of its own), or None
    and why there is none."""
    with tempfile.TemporaryDirectory(prefix="parallax-plan-") as folder:
        out = os.path.join(folder, "answer.json")
        env = {**os.environ, **contracts.PlanQuery(**{**query.__dict__, "out": out}).to_env()}
        code = subprocess.run([sys.executable, script, *arguments], env=env,
                              stdout=sys.stderr).returncode
        if not os.path.exists(out):
            return None, (f"the script failed (exit status {code})" if code else
                          "the script ended without calling parallax.get_runner")
        with open(out, encoding="utf-8") as answer:
            return contracts.from_wire(Answer, json.load(answer)), ""


def text(answer: Answer, script: str) -> str:
    """The answer as tables: the cluster and measured terms, every variable's method in each
    plan, and each plan's bytes, step, throughput and bound."""
    return "\n".join([*_measured_lines(answer, script), "", *_methods_table(answer), "",
                      *_plans_table(answer), "", *_auto_lines(answer.plans["AUTO"]),
                      *(f"{name}: refused: {plan.refused}" for name, plan in answer.plans.items()
                        if plan.refused)])


def _measured_lines(answer: Answer, script: str) -> List[str]:
    """The cluster, and the terms every plan's prediction rests on."""
    cluster, terms = answer.cluster, answer.terms
    lines = [f"{script} on {cluster.machines} machines x {cluster.workers_per_machine} "
             f"workers, links {explanation.rate(cluster.link.bandwidth)} and "
             f"{cluster.link.latency * 1e6:.3g} us a "
             f"message ({'measured' if cluster.link_measured else 'given'}), "
             f"{cluster.cores.per_machine} cores a machine"]
    if terms.unmeasured is not None:
        lines.append(f"not measured ({terms.unmeasured}): each run option's rule, "
                     "no prediction")
    elif terms.step_alone_ms is not None:
        lines.append(f"compute ({terms.compute}): one worker's step alone "
                     f"{terms.step_alone_ms:.3g} ms, {terms.step_cpu_ms:.3g} ms of CPU; "
                     f"{terms.workers_sharing_cores} workers a machine: "
                     f"{terms.worker_compute_ms:.3g} ms")
    else:
        lines.append(f"compute {terms.compute}: communication only")
    probed = terms.transport
    if probed:
        lines.append(
            "TensorFlow's transport, probed on "
            f"{'those machines' if cluster.link_measured else 'this machine'}: "
            f"a message {probed.message_seconds * 1e3:.2g} ms, of CPU "
            f"{probed.worker_cpu_message * 1e3:.2g} ms in a worker and "
            f"{probed.server_cpu_message * 1e3:.2g} ms in a server; a MB "
            f"{probed.worker_cpu_byte * 1e9:.2g} and {probed.server_cpu_byte * 1e9:.2g} ms; "
            f"a pushed row {probed.server_cpu_row * 1e6:.2g} us")
    ring = terms.collectives
    if ring:
        lines.append(
            f"{explanation.library_name(ring.library)} collectives, probed on "
            f"{'the first machine' if cluster.link_measured else 'this machine'}: a ring's "
            f"message {ring.message_seconds * 1e3:.2g} ms, of CPU "
            f"{ring.cpu_message * 1e3:.2g} ms; a MB {ring.cpu_byte * 1e9:.2g} ms; "
            f"an allgather {ring.cpu_allgather * 1e3:.2g} ms")
    if answer.fed:
        lines.append(_fed_steps(answer.fed))
    batch = answer.batch
    lines.append(f"batch: {batch.per_worker} examples a worker, {batch.combined} combined"
                 if batch.per_worker is not None else
                 f"batch unknown ({batch.unknown}; --batch)")
    return lines


def _methods_table(answer: Answer) -> List[str]:
    """Every variable, and its method in each plan."""
    names = list(answer.plans)
    rows = [["variable", "kind", "bytes", "rows", "alpha", *names]]
    for var in answer.variables:
        rows.append([var.name, var.kind, str(var.bytes),
                     "-" if var.rows_per_worker is None else str(var.rows_per_worker),
                     "-" if var.alpha is None else f"{var.alpha:.3g}",
                     *(_method(answer.plans[name].methods, var.name) for name in names)])
    return _table(rows)


def _plans_table(answer: Answer) -> List[str]:
    """Each plan's busiest link, step, throughput and bound."""
    rows = [["plan", "busiest link sent", "received", "step", "examples/s", "bound by"]]
    for name, plan in answer.plans.items():
        busiest = plan.busiest_link_bytes
        rows.append([name, *([_bytes(busiest.sent), _bytes(busiest.received)]
                             if busiest else ["-", "-"]),
                     "-" if plan.step_ms is None else f"{plan.step_ms:.3g} ms",
                     "-" if plan.examples_per_second is None
                     else f"{plan.examples_per_second:,.0f}",
                     plan.bound_by or ("refused" if plan.refused else "-")])
    return _table(rows)


def _auto_lines(auto: PlanShown) -> List[str]:
    lines = [f"AUTO: {auto.note}"]
    if auto.rules:
        lines.append("the rules' plans AUTO weighs against the cost model's choice (timed on "
                     "the cluster unless predicted slower by more than the model errs): "
                     + ", ".join(
                         f"{name} {rule.step_ms:.3g} ms ({rule.margin:+.0%}"
                         f"{'' if rule.timed else ', not timed'})"
                         for name, rule in auto.rules.items()))
    return lines


def _fed_steps(fed: FedSteps) -> str:
    """Which of a feeding script's runs were measured as the workers' batches."""
    steps, workers = fed.training_steps, fed.workers
    said = (f"input fed by the script: its first {steps} training steps' feeds, one a worker; "
            "the script ends at the last" if steps == workers else
            f"input fed by the script: its {steps} training steps' feeds, reused in turn for "
            f"{workers} workers")
    if fed.other_runs:
        said += (f"; {fed.other_runs} runs between them fetched no training op "
                 "(an evaluation's) and are not counted")
    return said


def _method(methods: Dict[str, Method], name: str) -> str:
    """A variable's method in a plan: its servers, or its shards' (split or partitioned)."""
    chosen = [m for shard, m in methods.items() if shard.startswith(f"{name}/part_")]
    if not chosen and name not in methods:
        return "-"
    chosen = chosen or [methods[name]]
    servers = [s for m in chosen for s in m.servers]
    if chosen[0].how != PS:
        return chosen[0].how.value
    if len(servers) == 1:
        return f"server {servers[0]}"
    return f"{len(servers)} shards on " + ",".join(map(str, servers))


def _table(rows: List[List[str]]) -> List[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
            for row in rows]


def _bytes(count: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return f"{count:.0f} B"


def parse(argv: Sequence[str]) -> Tuple[argparse.Namespace, str, List[str]]:
    """The options wherever they are; the first other word is the script, the rest (and
    everything after `--`) its arguments."""
    parser = argparse.ArgumentParser(
        prog="python -m parallax.plan",
        usage="python -m parallax.plan SCRIPT [ARGS] (--machines M --workers-per-machine W "
              "--link RATE | --resources R) [--inside-link RATE] [--latency-us L] [--cores C] "
              "[--step-ms T] [--batch B] [--json] [-- SCRIPT_ARGS]",
        description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--machines", type=script_command.positive)
    parser.add_argument("--workers-per-machine", type=script_command.positive)
    parser.add_argument("--link", type=rate, help="each way between machines: 10gbit, 100mbit")
    parser.add_argument("--inside-link", type=rate, help="between workers of one machine")
    parser.add_argument("--latency-us", type=float, default=200.0,
                        help="microseconds a message costs besides its bytes (200)")
    parser.add_argument("--cores", type=script_command.positive,
                        help="of each machine (this machine's)")
    parser.add_argument("--step-ms", type=float,
                        help="one worker's step alone, on its own device (measured here)")
    parser.add_argument("--batch", type=script_command.positive,
                        help="examples of one worker's batch (read from the input)")
    parser.add_argument("--resources", help="plan for these machines, their links probed")
    parser.add_argument("--json", action="store_true", help="print the answer as JSON")
    options, script, arguments = script_command.parse(parser, argv)
    if not options.resources and None in (options.machines, options.workers_per_machine,
                                          options.link):
        parser.error("give the cluster: --machines, --workers-per-machine and --link, "
                     "or --resources")
    if options.step_ms is not None and options.step_ms <= 0:
        parser.error(f"--step-ms must be more than 0, got {options.step_ms}")
    return options, script, arguments


def main(argv: Optional[Sequence[str]] = None) -> int:
    options, script, arguments = parse(sys.argv[1:] if argv is None else argv)
    query = contracts.PlanQuery(
        out="", machines=options.machines or 1,
        workers_per_machine=options.workers_per_machine or 1,
        bandwidth=options.link or 12.5e6, latency=options.latency_us * 1e-6,
        inside_bandwidth=options.inside_link,
        inside_latency=options.latency_us * 1e-6 if options.inside_link else None,
        cores=options.cores or 0,
        step=options.step_ms / 1e3 if options.step_ms is not None else None,
        batch=options.batch, resources=options.resources or "")
    answer, why = ask(script, arguments, query)
    if answer is None:
        print(f"parallax plan: not answered: {why}", file=sys.stderr)
        return NOT_ANSWERED
    print(json.dumps(contracts.to_wire(answer), indent=1) if options.json
          else text(answer, script))
    return 0


if __name__ == "__main__":
    sys.exit(main())
