"""Bytes a step should move over each host's link for the actual placement of each variable in
a benchmark job: the paper's Table 3 per machine link, as parallax/cost.py counts it (see its
docstring for the formulas), for H hosts of G workers.

Two facts of the wire that Table 3 leaves out are added: a variable on a server that a while
loop reads is pulled at every iteration (T times), unless the system copies it to the worker
once a step, as Parallax does; and TCP/IP over Ethernet frames each 1448-byte segment with 66
bytes of headers and acknowledges every second segment with a 66-byte packet the other way.
"""
from __future__ import annotations

import os
import sys
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from parallax.planning import cost  # noqa: E402  (the formulas themselves)
from parallax.planning.cost import ALLGATHER, ALLREDUCE, PS  # noqa: E402,F401 (the harness's)

SEGMENT, HEADERS = 1448, 66


def host_bytes(variables: List[dict], sync: Dict[str, Tuple[str, Optional[int]]], hosts: int,
               workers_per_host: int, **options) -> List[Dict[str, float]]:
    """[{tx, rx}] per host, both phases of the step (host_phase_bytes) together."""
    return both_phases(host_phase_bytes(variables, sync, hosts, workers_per_host, **options))


def both_phases(phases: List[List[Dict[str, float]]]) -> List[Dict[str, float]]:
    """[{tx, rx}] per host of a step's phases added up."""
    before, after = phases
    return [{d: b[d] + a[d] for d in ("tx", "rx")} for b, a in zip(before, after)]


def host_phase_bytes(variables: List[dict], sync: Dict[str, Tuple[str, Optional[int]]],
                     hosts: int, workers_per_host: int, unique_pulls: bool = False,
                     summed_pushes: bool = False, loop_copies: bool = False,
                     hierarchical_allreduce: bool = False) -> List[List[Dict[str, float]]]:
    """[{tx, rx}] per host in each of the step's two phases (cost.link_phases: the pulls before
    the compute, what follows it). `variables`: {name, bytes, rows, unique_rows, row_bytes,
    index_bytes, reads} (rows is None for a dense variable; unique_rows[k-1]: distinct ids in
    k workers' batches); `sync`: name -> (how, server host for PS)."""
    cluster = cost.Shape(hosts, workers_per_host)
    phases = [[{"tx": 0.0, "rx": 0.0} for _ in range(hosts)] for _ in range(2)]
    for variable in variables:
        for links, traffic in zip(phases, _variable_phases(
                variable, sync, cluster, unique_pulls, summed_pushes, loop_copies,
                hierarchical_allreduce)[2]):
            for link, (sent, received) in zip(links, traffic):
                link["tx"] += sent
                link["rx"] += received
    return phases


def pushes(variables: List[dict], sync: Dict[str, Tuple[str, Optional[int]]], hosts: int,
           workers_per_host: int, host: int, direction: str, unique_pulls: bool = False,
           summed_pushes: bool = False, loop_copies: bool = False,
           hierarchical_allreduce: bool = False, clipped_on_workers: bool = False
           ) -> List[Tuple[float, float]]:
    """[(the share of a worker's compute done when it can go, payload bytes)] per variable on
    `host`'s link in `direction` (tx, rx) in the step's second phase: a dense gradient pushed
    to a server goes when it is ready (cost.pushed_when_ready; the single worker's traced
    `ready`), unless the workers clip the gradients by their global norm before they push
    them (TF-PS: SyncReplicasOptimizer applies what the model's clipping made)."""
    cluster = cost.Shape(hosts, workers_per_host)
    sent = []
    for variable in variables:
        stats, method, (_, second) = _variable_phases(
            variable, sync, cluster, unique_pulls, summed_pushes, loop_copies,
            hierarchical_allreduce)
        early = cost.pushed_when_ready(stats, method) and not clipped_on_workers
        sent.append((variable.get("ready", 1.0) if early else 1.0,
                     second[host][0 if direction == "tx" else 1]))
    return sent


def _variable_phases(variable, sync, cluster, unique_pulls, summed_pushes, loop_copies,
                     hierarchical_allreduce):
    """The variable in the cost model's terms, its method, and its bytes in the two phases."""
    stats, method = _in_cost_terms(variable, sync, loop_copies)
    return stats, method, cost.link_phases(
        stats, method, cluster, local_aggregation=summed_pushes, unique_pulls=unique_pulls,
        hierarchical_allreduce=hierarchical_allreduce)


def waits_seconds(variables: List[dict], sync: Dict[str, Tuple[str, Optional[int]]],
                  hosts: int, workers_per_host: int, hierarchical_allreduce: bool = False,
                  loop_copies: bool = False, **_) -> float:
    """cost.waits for the job: the seconds of its step's communication that are not bytes
    (messages' latency at the cost model's assumed figure, machine stages' Horovod cycles)."""
    choice, stats = _plan(variables, sync, loop_copies)
    return cost.waits(choice, stats, cost.Shape(hosts, workers_per_host), cost.Links(),
                      hierarchical_allreduce)


def server_updates(variables: List[dict], sync: Dict[str, Tuple[str, Optional[int]]],
                   hosts: int, workers_per_host: int, loop_copies: bool = False,
                   **_) -> Tuple[float, List[float]]:
    """cost.server_updates for the job: the share of a worker's compute its servers' updates
    take off it, and per host its server's share (the single worker's traced `update`)."""
    choice, stats = _plan(variables, sync, loop_copies)
    return cost.server_updates(choice, stats, cost.Shape(hosts, workers_per_host))


def _plan(variables: List[dict], sync: Dict[str, Tuple[str, Optional[int]]], loop_copies: bool
          ) -> Tuple[Dict[str, cost.Method], Dict[str, cost.VariableStats]]:
    """The job's variables as the cost model's plan: (methods, statistics) by name."""
    placed = [_in_cost_terms(variable, sync, loop_copies) for variable in variables]
    return ({stats.name: method for stats, method in placed},
            {stats.name: stats for stats, _ in placed})


def _in_cost_terms(variable: dict, sync: Dict[str, Tuple[str, Optional[int]]],
                   loop_copies: bool) -> Tuple[cost.VariableStats, cost.Method]:
    """A variable of the benchmark's record as the cost model takes it, and its method."""
    how, server = sync[variable["name"]]
    sparse = variable["rows"] is not None and how != ALLREDUCE
    stats = cost.VariableStats(
        variable["name"], variable["bytes"], rows=variable["rows"] if sparse else None,
        row_bytes=variable.get("row_bytes", 0), index_bytes=variable.get("index_bytes", 8),
        unique=tuple(variable.get("unique_rows") or ()),
        reads=1 if loop_copies else variable.get("reads", 1), update=variable.get("update", 0.0))
    return stats, cost.Method(how, (server,) if how == PS else ())


def on_the_wire(payload: Dict[str, float]) -> Dict[str, float]:
    """A link's payload bytes (tx, rx) as the interface counts them, framing included."""
    def framed(own, other):
        return own * (1 + HEADERS / SEGMENT) + other / SEGMENT / 2 * HEADERS
    return {"tx": framed(payload["tx"], payload["rx"]), "rx": framed(payload["rx"], payload["tx"])}
