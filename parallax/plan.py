"""Plan: how each variable is synchronized and where it lives, decided once from the analysis,
the config and the cluster."""
from __future__ import annotations

import dataclasses
import enum
from typing import Dict, List, Optional

from parallax.analysis import GraphAnalysis, VariableInfo
from parallax.cluster import Cluster
from parallax.config import Config, PSConfig


class Sync(enum.Enum):
    ALLREDUCE = "allreduce"  # replicated; dense gradient summed/averaged with Horovod
    ALLGATHER = "allgather"  # replicated; sparse gradient slices gathered from every worker
    PS = "parameter server"  # one copy on a server; gradients aggregated there


@dataclasses.dataclass
class VariablePlan:
    variable: VariableInfo
    sync: Sync
    average: bool  # aggregate as the mean over workers, else the sum
    server: Optional[int] = None  # the server holding it, for Sync.PS


@dataclasses.dataclass
class Plan:
    run_option: str  # the effective one: HYBRID without sparse variables is AR, etc.
    cluster: Cluster
    variables: Dict[str, VariablePlan]
    extra_state_servers: Dict[str, int]  # extra state living on a server: its server
    server_writes: List[str]  # ops updating server-resident state: once per step, by the chief
    ps_config: PSConfig  # which optimizations of the parameter-server path are on
    run_index: int = 0  # which get_runner call of the process this plan is for

    @property
    def num_workers(self) -> int:
        return self.cluster.num_workers

    def with_sync(self, *kinds: Sync) -> List[VariablePlan]:
        return [p for p in self.variables.values() if p.sync in kinds]

    def server_of(self, variable: str) -> Optional[int]:
        if variable in self.variables:
            return self.variables[variable].server
        return self.extra_state_servers.get(variable)


def effective_run_option(run_option: str, analysis: GraphAnalysis) -> str:
    """HYBRID needs both kinds of variable; without one of them it is AR or PS, so no process
    is started that would have nothing to do."""
    if run_option != "HYBRID":
        return run_option
    if not analysis.sparse:
        return "AR"
    return "PS" if not analysis.dense else "HYBRID"


def make_plan(analysis: GraphAnalysis, config: Config, cluster: Cluster,
              run_index: int = 0) -> Plan:
    run_option = effective_run_option(config.run_option, analysis)
    variables = {}
    for info in analysis.variables.values():
        average = config.average_sparse if info.is_sparse else config.average_dense
        if run_option == "PS" or (run_option == "HYBRID" and info.is_sparse):
            sync = Sync.PS
        else:
            sync = Sync.ALLGATHER if info.is_sparse else Sync.ALLREDUCE
        variables[info.name] = VariablePlan(info, sync, average)
    _partition_by_bytes([p for p in variables.values() if p.sync is Sync.PS],
                        len(cluster.servers))
    extra_state_servers = _place_extra_state(analysis, variables, run_option)
    server_writes = [op for p in variables.values() if p.sync is Sync.PS
                     for op in p.variable.update_ops]
    server_writes += [op for name in extra_state_servers
                      for op in analysis.extra_state[name].update_ops]
    return Plan(run_option, cluster, variables, extra_state_servers, server_writes,
                config.ps_config, run_index)


def _partition_by_bytes(on_servers: List[VariablePlan], num_servers: int) -> None:
    """Largest first onto the least-loaded server: balances the bytes each server moves."""
    load = [0] * max(num_servers, 1)
    for var_plan in sorted(on_servers, key=lambda p: -p.variable.nbytes):
        server = load.index(min(load))
        var_plan.server = server
        load[server] += var_plan.variable.nbytes


def _place_extra_state(analysis, variables, run_option) -> Dict[str, int]:
    """Extra state lives with its owner (TF's colocation: slots, moving averages, beta powers).
    State with no owner (global_step) is on the first server in PS mode, and replicated when
    replicas exist, as is state that replicated variables' updates read (beta powers): each
    replica then updates its own copy once per step, identically."""
    read_by_replicas = set()
    for var_plan in variables.values():
        if var_plan.sync is not Sync.PS:
            read_by_replicas.update(analysis.inputs_of_updates(var_plan.variable.name))
    servers = {}
    for state in analysis.extra_state.values():
        owner = variables.get(state.owner)
        if state.name in read_by_replicas:
            continue
        if owner is not None and owner.sync is Sync.PS:
            servers[state.name] = owner.server
        elif owner is None and run_option == "PS":
            servers[state.name] = 0
    return servers


def describe(plan: Plan) -> str:
    """A table of every variable: kind, shape, bytes, where it lives, how it is synchronized."""
    rows = [("variable", "kind", "shape", "bytes", "lives on", "synchronized by")]
    for var_plan in plan.variables.values():
        info = var_plan.variable
        how = f"{var_plan.sync.value} ({'mean' if var_plan.average else 'sum'})"
        if var_plan.sync is Sync.PS:
            where = f"server {var_plan.server} ({plan.cluster.servers[var_plan.server]})"
        else:
            where = "every worker (replica)"
        rows.append((info.name, "sparse" if info.is_sparse else "dense", str(list(info.shape)),
                     str(info.nbytes), where, how))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
             for row in rows]
    header = (f"Parallax plan: run_option={plan.run_option}, {plan.num_workers} workers on "
              f"{plan.cluster.num_machines} machines, {len(plan.cluster.servers)} servers"
              + (", local aggregation" if plan.ps_config.local_aggregation and plan.cluster.servers else ""))
    return "\n".join([header] + lines)
