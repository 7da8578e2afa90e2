"""Plan: how each variable is synchronized and where it lives, decided once from the analysis,
the config and the cluster."""
from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from parallax import cost
from parallax.analysis import GraphAnalysis, VariableInfo
from parallax.cluster import Cluster
from parallax.config import Config, PSConfig
from parallax.errors import ParallaxError

if TYPE_CHECKING:  # parallax.auto reads the graph through the passes, which read plans
    from parallax.auto import Decision


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
    uses_horovod: bool  # replicas exist: dense gradients, or state to average or broadcast
    # With Config.sync_batch_norm: the (mean, variance) ops of the batch moments to combine.
    batch_moments: List[Tuple[str, str]]
    averaged_writes: List[str]  # writes of per-worker state, whose value is averaged
    run_index: int = 0  # which get_runner call of the process this plan is for
    decision: Optional[Decision] = None  # run_option='AUTO': what was measured and chosen
    # Config(sync=False): each worker updates the servers' variables with its own gradients
    asynchronous: bool = False
    # dense gradients allreduced in machine stages (passes/machine_allreduce.py)
    hierarchical_allreduce: bool = False

    @property
    def sync_batch_norm(self) -> bool:
        return bool(self.batch_moments)

    @property
    def num_workers(self) -> int:
        return self.cluster.num_workers

    def with_sync(self, *kinds: Sync) -> List[VariablePlan]:
        return [p for p in self.variables.values() if p.sync in kinds]

    def server_of(self, variable: str) -> Optional[int]:
        if variable in self.variables:
            return self.variables[variable].server
        return self.extra_state_servers.get(variable)


def effective_run_option(run_option: str, analysis: GraphAnalysis,
                         decision: Optional[Decision] = None) -> str:
    """HYBRID needs both kinds of variable; without one of them it is AR or PS, so no process
    is started that would have nothing to do. AUTO is what its decision makes of it."""
    if run_option == "AUTO":
        on_servers = [_chosen(info, decision)[0] is Sync.PS for info in analysis.variables.values()]
        return "PS" if all(on_servers) else "HYBRID" if any(on_servers) else "AR"
    if run_option != "HYBRID":
        return run_option
    if not analysis.sparse:
        return "AR"
    return "PS" if not analysis.dense else "HYBRID"


def make_plan(analysis: GraphAnalysis, config: Config, cluster: Cluster,
              run_index: int = 0, decision: Optional[Decision] = None) -> Plan:
    run_option = effective_run_option(config.run_option, analysis, decision)
    if config.sync_batch_norm and analysis.fused_batch_norms:
        raise ParallaxError(
            f"sync_batch_norm: {analysis.fused_batch_norms[0]!r} is a fused batch norm, whose "
            "statistics are computed inside one kernel and cannot be combined across workers; "
            "build it unfused (tf.nn.moments and tf.nn.batch_normalization, or Keras's "
            "BatchNormalization), or leave sync_batch_norm off")
    variables = {}
    for info in analysis.variables.values():
        average = config.average_sparse if info.is_sparse else config.average_dense
        if decision is not None:
            sync, server = _chosen(info, decision, config.run_option)
        else:
            sync, server = rule(run_option, info), None
        variables[info.name] = VariablePlan(info, sync, average, server)
    _partition_by_bytes([p for p in variables.values() if p.sync is Sync.PS
                         and p.server is None], len(cluster.servers))
    extra_state_servers = _place_extra_state(analysis, variables, run_option)
    server_writes = [op for p in variables.values() if p.sync is Sync.PS
                     for op in p.variable.update_ops]
    server_writes += [op for name in extra_state_servers
                      for op in analysis.extra_state[name].update_ops]
    server_writes = list(dict.fromkeys(server_writes))  # one op may update several
    _check_differentiated_gradients_allreduced(analysis, variables)
    if config.sync:  # the chief alone applies the step's aggregates
        _check_server_writes_follow_gradients(analysis, server_writes)
        _check_no_conditional_server_writes(analysis, server_writes)
        _check_writes_on_one_side(analysis, variables, extra_state_servers)
    elif run_option == "AR":
        raise ParallaxError(
            "sync=False: asynchronous training updates variables on parameter servers, and "
            "this plan has none (HYBRID, for a model without sparse gradients); use "
            "run_option='PS', or train synchronously")
    return Plan(run_option, cluster, variables, extra_state_servers, server_writes,
                config.ps_config, uses_horovod(run_option, analysis, config.sync_batch_norm),
                analysis.batch_moments if config.sync_batch_norm else [],
                analysis.averaged_writes, run_index, decision, not config.sync,
                _machine_stages(config, cluster, variables, decision))


def _machine_stages(config: Config, cluster: Cluster, variables: Dict[str, VariablePlan],
                    decision: Optional[Decision]) -> bool:
    """Config.hierarchical_allreduce where the cluster allows it (Cluster.machine_groups); by
    default, AUTO's decision, or when the cost model predicts it faster for the bytes this
    plan allreduces."""
    if not cluster.machine_groups() or config.hierarchical_allreduce is False:
        return False
    if config.hierarchical_allreduce:
        return True
    if (decision is not None and decision.machine_stages is not None
            and all(name in decision.methods for name in variables)):
        return decision.machine_stages  # for this graph (not one built after it)
    allreduced = sum(p.variable.nbytes for p in variables.values() if p.sync is Sync.ALLREDUCE)
    links = decision.link_model() if decision is not None else cost.Links()
    return cost.machine_stages_pay(allreduced, _cost_shape(cluster), links)


def _cost_shape(cluster: Cluster) -> cost.Cluster:
    return cost.Cluster(cluster.num_machines, max(len(cluster.workers_on(m))
                                                  for m in range(cluster.num_machines)))


def rule(run_option: str, info: VariableInfo) -> Sync:
    """How a run option synchronizes a variable (AUTO: when it decided nothing, as HYBRID)."""
    if run_option == "PS" or (run_option in ("HYBRID", "AUTO") and info.is_sparse):
        return Sync.PS
    return Sync.ALLGATHER if info.is_sparse else Sync.ALLREDUCE


def _chosen(info: VariableInfo, decision: Decision,
            run_option: str = "AUTO") -> Tuple[Sync, Optional[int]]:
    """The driver's decision for a variable (its server, if it decided one); the run option's
    rule for one the driver did not see (a graph built after the first get_runner)."""
    chosen = decision.methods.get(info.name)
    if chosen is None:
        return rule(run_option, info), None
    return Sync(chosen["how"]), chosen["server"]


def validate(analysis: GraphAnalysis, config: Config,
             decision: Optional[Decision] = None) -> None:
    """Raise, in the driver before anything starts, the errors make_plan would raise in the
    workers: which side of the servers a variable is on does not depend on the cluster."""
    make_plan(analysis, config, Cluster(worker_machines=[0], servers=["validation:0"]),
              decision=decision)


def _check_differentiated_gradients_allreduced(analysis, variables) -> None:
    """A gradient differentiated again (a gradient penalty) is the aggregate, as on one device
    the combined batch's gradient is: an allreduce's sum or mean, whose gradient Horovod
    defines, differentiates as that; a gather of rows or a server's aggregation does not (a
    server's would wait for the step it is part of)."""
    for name in analysis.differentiated:
        plan = variables[name]
        if plan.sync is not Sync.ALLREDUCE:
            raise ParallaxError(
                f"the gradient of {name!r} is differentiated again (a loss computed from "
                "gradients: a gradient penalty, double backprop), and Parallax aggregates it "
                f"by {plan.sync.value}, which cannot be differentiated as the combined batch's "
                "gradient. Only a dense gradient, allreduced, can: use run_option='AR'"
                + (", and a variable whose gradient is dense (not an embedding lookup's)"
                   if plan.variable.is_sparse else ""))


def _check_writes_on_one_side(analysis, variables, extra_state_servers) -> None:
    """An op that updates server variables runs on the chief only; one that also updates
    replicas (a tf.cond applying every update) would leave the other workers' replicas behind."""
    on_server, replicated = set(), set()
    for name, info in analysis.variables.items():
        side = on_server if variables[name].sync is Sync.PS else replicated
        side.update(info.update_ops)
    for name, state in analysis.extra_state.items():
        side = on_server if name in extra_state_servers else replicated
        side.update(state.update_ops)
    for op in sorted(on_server & replicated):
        raise ParallaxError(
            f"{op!r} updates variables on parameter servers and replicated ones at once: the "
            "chief alone runs updates of server variables. Update them in separate ops (say, "
            "two tf.conds), or use run_option='AR' or 'PS'")


def _check_server_writes_follow_gradients(analysis, server_writes) -> None:
    """A server-side update the gradients wait for would wait for a step token that comes only
    after the gradients are pushed: refused instead of deadlocking."""
    for name in server_writes:
        if name in analysis.before_gradients:
            raise ParallaxError(
                f"{name!r} updates a variable on a parameter server, and the gradients are "
                "computed after it (a control dependency or a data path): in PS/HYBRID mode "
                "server variables are updated once per step after the gradients are "
                "aggregated. Update it after the train op (tf.control_dependencies([train_op]))"
                ", or use run_option='AR' or 'AUTO' (which keeps its variable off the servers)")


def _check_no_conditional_server_writes(analysis, server_writes) -> None:
    """Updates of server variables inside tf.cond or a while loop are refused: the chief would
    apply them in a function whose untaken branch does not wait for the step's gradients, and
    the step's end could not be told apart from its start."""
    for name in server_writes:
        if analysis.function_calls.get(name):
            raise ParallaxError(
                f"{name!r} (a TensorFlow {analysis.function_calls[name]} op) updates "
                "variables that live on parameter servers inside its function (tf.cond, "
                "tf.while_loop): in PS/HYBRID "
                "mode updates of server variables must be ops of the graph itself. Apply the "
                "update unconditionally (say, with the gradient scaled by 0 or 1), or use "
                "run_option='AR'")


def _partition_by_bytes(on_servers: List[VariablePlan], num_servers: int) -> None:
    """Largest first onto the least-loaded server (cost.balance_by_bytes)."""
    servers = cost.balance_by_bytes([(p.variable.name, p.variable.nbytes) for p in on_servers],
                                    num_servers)
    for var_plan in on_servers:
        var_plan.server = servers[var_plan.variable.name]


def _place_extra_state(analysis, variables, run_option) -> Dict[str, int]:
    """Extra state lives with its owner (TF's colocation: slots, moving averages, beta powers).
    In PS mode, state with no owner that the step writes from the gradients (global_step,
    accumulators) is on the first server. State that replicated variables' updates read (beta
    powers) is replicated, each replica updating its own copy identically; so is state written
    from each worker's own data (kept identical by averaging its writes) and state written
    independently of the gradients (a random generator's seed)."""
    read_by_replicas = set()
    for var_plan in variables.values():
        if var_plan.sync is not Sync.PS:
            read_by_replicas.update(analysis.inputs_of_updates(var_plan.variable.name))
    servers = {}
    for state in analysis.extra_state.values():
        owner = variables.get(state.owner)
        if state.name in read_by_replicas or state.per_worker:
            continue
        if owner is not None and owner.sync is Sync.PS:
            servers[state.name] = owner.server
        elif owner is None and run_option == "PS" and state.after_gradients:
            servers[state.name] = 0
    return servers


def uses_horovod(run_option: str, analysis: GraphAnalysis, sync_batch_norm: bool) -> bool:
    """Whether the job's workers join Horovod: for dense gradients, batch statistics to combine,
    and in PS mode for the variables that stay replicated (per-worker state to average,
    replicas to broadcast)."""
    if run_option != "PS" or (sync_batch_norm and analysis.batch_moments):
        return True
    if analysis.averaged_writes:  # of global or local variables (a metric's)
        return True
    return any(name not in analysis.variables and not _on_server_in_ps(analysis, name)
               for name in analysis.all_variables)


def _on_server_in_ps(analysis: GraphAnalysis, name: str) -> bool:
    state = analysis.extra_state.get(name)
    return state is not None and not state.per_worker and (
        state.owner is not None or state.after_gradients)


def describe(plan: Plan) -> str:
    """A table of every variable: kind, shape, bytes, where it lives, how it is synchronized;
    under AUTO also alpha (the share of its rows one worker's batch touches), the bytes that
    its busiest link direction carries in a step as predicted (in each of the step's phases,
    cost.link_phases), and the share of the predicted step those bytes take."""
    stats = plan.decision.variable_stats() if plan.decision is not None else {}
    predicted = _predicted_bytes(plan, stats)
    rows = [("variable", "kind", "shape", "bytes", "lives on", "synchronized by")
            + (("alpha", "predicted bytes", "share of step") if predicted else ())]
    if predicted:
        seconds_per_byte = 1 / (plan.decision.link_model().bandwidth * (plan.decision.step or 1))
    for var_plan in plan.variables.values():
        info = var_plan.variable
        how = f"{var_plan.sync.value} ({'mean' if var_plan.average else 'sum'})"
        if plan.asynchronous and var_plan.sync is Sync.PS:
            how = f"{var_plan.sync.value} (asynchronous)"
        if var_plan.sync is Sync.PS:
            where = f"server {var_plan.server} ({plan.cluster.servers[var_plan.server]})"
        else:
            where = "every worker (replica)"
        row = (info.name, "sparse" if info.is_sparse else "dense", str(list(info.shape)),
               str(info.nbytes), where, how)
        if predicted and info.name not in predicted:  # a graph the driver did not measure
            row += ("-", "-", "-")
        elif predicted:
            measured = stats[info.name]
            alpha = f"{measured.distinct(1) / info.shape[0]:.3f}" if measured.sparse else "-"
            row += (alpha, f"{predicted[info.name]:.0f}",
                    f"{predicted[info.name] * seconds_per_byte:.0%}")
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
             for row in rows]
    auto = plan.decision is not None and plan.decision.run_option == "AUTO"
    run_option = f"AUTO ({plan.run_option}'s passes)" if auto else plan.run_option
    header = (f"Parallax plan: run_option={run_option}, {plan.num_workers} workers on "
              f"{plan.cluster.num_machines} machines, {len(plan.cluster.servers)} servers"
              + (", local aggregation"
                 if plan.ps_config.local_aggregation and plan.cluster.servers else "")
              + (", allreduce in machine stages" if plan.hierarchical_allreduce
                 and plan.with_sync(Sync.ALLREDUCE) else ""))
    if plan.asynchronous:
        header += ("\nasynchronous: each worker applies its own gradients to the servers' "
                   "variables as they arrive" + ("; dense variables are allreduced, in step"
                                                 if plan.with_sync(Sync.ALLREDUCE) else ""))
    if plan.decision is not None:
        header += f"\n{'AUTO' if auto else 'servers and shards'}: {plan.decision.note}"
    return "\n".join([header] + lines)


def _predicted_bytes(plan: Plan, stats: Dict[str, cost.VariableStats]) -> Dict[str, float]:
    """Per variable, the bytes of a step on the link direction it loads most in each phase
    (AUTO plans that measured `stats`)."""
    if not stats:
        return {}
    shape = _cost_shape(plan.cluster)
    predicted = {}
    for name, var_plan in plan.variables.items():
        if name not in stats:
            continue
        method = cost.Method(var_plan.sync.value,
                             (var_plan.server,) if var_plan.sync is Sync.PS else ())
        phases = cost.link_phases(
            stats[name], method, shape, local_aggregation=plan.ps_config.local_aggregation,
            unique_pulls=plan.ps_config.boundary_between_workers_and_servers,
            hierarchical_allreduce=plan.hierarchical_allreduce)
        predicted[name] = cost.busiest_bytes(phases)
    return predicted
