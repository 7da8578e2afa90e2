"""The plan: how each variable is synchronized and where it lives, decided once, by the driver,
from the analysis, the plan options, the cluster's shape and (AUTO) what the search chose. It is one
value: the driver sends it to every worker (`to_text`), which reads it (`from_text`) and binds
it to its own copy of the graph and its identity (`bind`), deciding nothing again."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

from parallax import contracts
from parallax.cluster import Cluster
from parallax.config import PlanOptions, PSConfig
from parallax.errors import ParallaxError
from parallax.planning import cost
from parallax.planning.candidates import balance_by_bytes, rule
from parallax.planning.cost import Sync
from parallax.planning.analysis import GraphAnalysis, VariableInfo
from parallax.planning.proposal import Alternative, PartitionCount
from parallax.vocabulary import CONDITIONAL_OPS


@dataclasses.dataclass
class Decision:
    """What the planner chose (planner.decide), as the plan carries it to every worker."""
    # Per variable, shards apart: how it is synchronized, and on a server, its one server
    methods: Dict[str, cost.Method]
    stats: Dict[str, cost.VariableStats]  # per variable, as measured; empty: nothing was
    note: str  # how it was decided
    # Seconds of a worker's compute, its machine's cores shared (cost.shared_compute)
    compute: Optional[float] = None
    # Seconds of one worker's step alone, the speed of a server's updates (cost.step_time)
    alone: Optional[float] = None
    links: Optional[cost.Links] = None  # between machines, as the decision assumed them
    step: Optional[float] = None  # seconds of a step of the chosen plan, as predicted
    # With search_partitions: the shards of each call of get_partitioner
    partitions: List[PartitionCount] = dataclasses.field(default_factory=list)
    # Allreduce in machine stages (Config.hierarchical_allreduce); None: not decided here
    machine_stages: Optional[bool] = None
    # The variables the workers split (rewriting/split_variables.py), in so many shards
    splits: Dict[str, int] = dataclasses.field(default_factory=dict)
    # The Config's run option it was made for: AUTO, or another whose servers and shards
    # (search_partitions, split_variables) were chosen here
    run_option: str = "AUTO"
    # Other plans AUTO times on the cluster before it keeps the fastest (Config.trial_steps)
    alternatives: List[Alternative] = dataclasses.field(default_factory=list)
    name: str = "the cost model's choice"  # or the rule of an alternative

    def alternative(self, index: int) -> "Decision":
        """This decision with the methods of its alternative `index` instead of its own."""
        chosen = self.alternatives[index]
        return dataclasses.replace(
            self, methods=chosen.methods, machine_stages=chosen.machine_stages,
            step=chosen.step, note=f"{chosen.name}, timed against the cost model's "
            f"choice; {self.note}", alternatives=[], name=chosen.name)

    def link_model(self) -> cost.Links:
        return self.links or cost.Links()


@dataclasses.dataclass
class VariablePlan:
    # None in a plan not bound to a graph yet (Plan.bind): each worker has its own analysis
    variable: Optional[VariableInfo] = dataclasses.field(metadata=contracts.NOT_SENT)
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
    uses_collectives: bool  # replicas exist: dense gradients, or state to average or broadcast
    # With Config.sync_batch_norm: the (mean, variance) ops of the batch moments to combine,
    # and the fused batch norms in training mode.
    batch_moments: List[Tuple[str, str]]
    fused_batch_norms: List[str]
    # With sync_batch_norm=False: the batch norms found, each normalizing a worker's own batch.
    unsynchronized_batch_norms: List[str]
    averaged_writes: List[str]  # writes of per-worker state, whose value is averaged
    summed_writes: List[str]  # writes adding a count of the worker's batch: summed
    run_index: int = 0  # which get_runner call of the process this plan is for
    decision: Optional[Decision] = None  # run_option='AUTO': what was measured and chosen
    # Config(sync=False): each worker updates the servers' variables with its own gradients
    asynchronous: bool = False
    # dense gradients allreduced in machine stages (rewriting/machine_allreduce.py)
    hierarchical_allreduce: bool = False
    # The workers build another graph than the driver's: the search gave
    # parallax.get_partitioner's calls other shard counts, which only the workers' graph code
    # reads (contracts.read_partition_counts). Each worker makes this plan again from the
    # decision, for the shards it built.
    replan_in_workers: bool = False
    requested_run_option: str = ""  # Config.run_option, where it differs from run_option
    # Losses' denominators that are sums over the batch (analysis.loss_denominators): each
    # the mean over workers, so that every worker divides by the combined batch's share.
    loss_denominators: List[str] = dataclasses.field(default_factory=list)

    @property
    def sync_batch_norm(self) -> bool:
        return bool(self.batch_moments or self.fused_batch_norms)

    @property
    def steps_use_collectives(self) -> bool:
        """Whether the training steps themselves run collectives (a replica's gradient,
        per-worker state to combine, batch statistics); a plan that uses collectives without
        them needs them only for its replicas' first broadcast."""
        return bool(self.with_sync(Sync.ALLREDUCE, Sync.ALLGATHER) or self.averaged_writes
                    or self.summed_writes or self.sync_batch_norm or self.loss_denominators)

    @property
    def num_workers(self) -> int:
        return self.cluster.num_workers

    def with_sync(self, *kinds: Sync) -> List[VariablePlan]:
        return [p for p in self.variables.values() if p.sync in kinds]

    def server_of(self, variable: str) -> Optional[int]:
        if variable in self.variables:
            return self.variables[variable].server
        return self.extra_state_servers.get(variable)

    def to_text(self) -> str:
        """The plan as the driver sends it (contracts.to_text): every field but the analysis'
        objects, which a worker binds of its own (`bind`)."""
        return contracts.to_text(self)

    @classmethod
    def from_text(cls, text: str) -> "Plan":
        """The plan the driver sent, not bound yet to a graph (`bind`)."""
        return contracts.from_text(cls, text)

    def bind(self, analysis: GraphAnalysis, cluster: Cluster) -> "Plan":
        """This plan for a worker: its variables bound to the worker's analysis of its copy of
        the graph, and its cluster the worker's own (its id, the servers' addresses)."""
        if set(analysis.variables) != set(self.variables) or (
                cluster.worker_machines != self.cluster.worker_machines
                or len(cluster.servers) != len(self.cluster.servers)):
            differ = sorted(set(analysis.variables) ^ set(self.variables))
            raise ParallaxError(
                "this worker's graph is not the one the driver planned for"
                + (f" (variables {differ[:3]} are in one of them only)" if differ else "")
                + ": the script must build the same graph in every process, whatever "
                "the environment (no random names, no dependence on the host)")
        variables = {name: dataclasses.replace(p, variable=analysis.variables[name])
                     for name, p in self.variables.items()}
        return dataclasses.replace(self, variables=variables, cluster=cluster)


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


def make_plan(analysis: GraphAnalysis, options: PlanOptions, cluster: Cluster,
              run_index: int = 0, decision: Optional[Decision] = None) -> Plan:
    run_option, variables = _methods(analysis, options, decision)
    _partition_by_bytes([p for p in variables.values() if p.sync is Sync.PS
                         and p.server is None], len(cluster.servers))
    extra_state_servers, server_writes = _check(analysis, options, run_option, variables)
    sync = options.sync_batch_norm is not False  # None: wherever batch statistics are found
    return Plan(
        run_option=run_option, cluster=cluster, variables=variables,
        extra_state_servers=extra_state_servers, server_writes=server_writes,
        ps_config=options.ps_config,
        uses_collectives=uses_collectives(run_option, analysis, sync),
        batch_moments=analysis.batch_moments if sync else [],
        fused_batch_norms=analysis.fused_batch_norms if sync else [],
        unsynchronized_batch_norms=[] if sync else batch_norms(analysis),
        averaged_writes=analysis.averaged_writes, summed_writes=analysis.summed_writes,
        run_index=run_index, decision=decision, asynchronous=not options.sync,
        hierarchical_allreduce=_machine_stages(options, cluster, variables, decision),
        requested_run_option=options.run_option,
        loss_denominators=list(analysis.loss_denominators))


def check_plan(analysis: GraphAnalysis, options: PlanOptions) -> None:
    """Raise what make_plan refuses of this graph and these options, on any cluster: which side of
    the servers each variable and its state are on does not depend on the cluster. The driver
    checks it before it reads the resources."""
    _check(analysis, options, *_methods(analysis, options, None))


def _methods(analysis: GraphAnalysis, options: PlanOptions, decision: Optional[Decision]
             ) -> Tuple[str, Dict[str, VariablePlan]]:
    """The effective run option, and each variable's method (its server, if the decision
    chose it)."""
    run_option = effective_run_option(options.run_option, analysis, decision)
    variables = {}
    for info in analysis.variables.values():
        average = options.average_sparse if info.is_sparse else options.average_dense
        if decision is not None:
            sync, server = _chosen(info, decision, options.run_option)
        else:
            sync, server = rule(run_option, info.is_sparse), None
        variables[info.name] = VariablePlan(info, sync, average, server)
    return run_option, variables


def _check(analysis: GraphAnalysis, options: PlanOptions, run_option: str,
           variables: Dict[str, VariablePlan]) -> Tuple[Dict[str, int], List[str]]:
    """Where extra state lives and which ops update server state, having refused a plan whose
    updates could not run once a step on the chief."""
    extra_state_servers = _place_extra_state(analysis, variables, run_option)
    server_writes = [op for p in variables.values() if p.sync is Sync.PS
                     for op in p.variable.update_ops]
    server_writes += [op for name in extra_state_servers
                      for op in analysis.extra_state[name].update_ops]
    server_writes = list(dict.fromkeys(server_writes))  # one op may update several
    _check_differentiated_gradients_allreduced(analysis, variables)
    if options.sync:  # the chief alone applies the step's aggregates
        _check_server_writes_follow_gradients(analysis, server_writes)
        _check_no_server_writes_in_loops(analysis, server_writes)
        _check_writes_on_one_side(analysis, variables, extra_state_servers)
    elif run_option == "AR":
        raise ParallaxError(
            "sync=False: asynchronous training updates variables on parameter servers, and "
            "this plan has none (HYBRID, for a model without sparse gradients); use "
            "run_option='PS', or train synchronously")
    return extra_state_servers, server_writes


def _machine_stages(options: PlanOptions, cluster: Cluster, variables: Dict[str, VariablePlan],
                    decision: Optional[Decision]) -> bool:
    """options.hierarchical_allreduce where the cluster allows it (Cluster.machine_groups); by
    default, AUTO's decision, or when the cost model predicts it faster for the bytes this
    plan allreduces."""
    if not cluster.machine_groups() or options.hierarchical_allreduce is False:
        return False
    if options.hierarchical_allreduce:
        return True
    if (decision is not None and decision.machine_stages is not None
            and all(name in decision.methods for name in variables)):
        return decision.machine_stages  # for this graph (not one built after it)
    allreduced = sum(p.variable.nbytes for p in variables.values() if p.sync is Sync.ALLREDUCE)
    links = decision.link_model() if decision is not None else cost.Links()
    return cost.machine_stages_pay(allreduced, cost_shape(cluster), links)


def cost_shape(cluster: Cluster) -> cost.Shape:
    return cost.Shape(cluster.num_machines, max(len(cluster.workers_on(m))
                                                  for m in range(cluster.num_machines)))


def _chosen(info: VariableInfo, decision: Decision,
            run_option: str = "AUTO") -> Tuple[Sync, Optional[int]]:
    """The driver's decision for a variable (its server, if it decided one); the run option's
    rule for one the driver did not see (a graph built after the first get_runner)."""
    chosen = decision.methods.get(info.name)
    if chosen is None:
        return rule(run_option, info.is_sparse), None
    return chosen.how, chosen.servers[0] if chosen.servers else None


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
    on_server, replicated = {}, {}  # update op (or v1 cond) -> the trained variables it updates
    for name, info in analysis.variables.items():
        side = on_server if variables[name].sync is Sync.PS else replicated
        for op in info.update_ops:
            side.setdefault(analysis.in_v1_cond.get(op, op), []).append(name)
    for name, state in analysis.extra_state.items():
        side = on_server if name in extra_state_servers else replicated
        for op in state.update_ops:
            side.setdefault(analysis.in_v1_cond.get(op, op), [])
    for op in sorted(on_server.keys() & replicated.keys()):
        raise ParallaxError(
            f"{op!r} updates variables on parameter servers {on_server[op][:3]} and replicated "
            f"ones {replicated[op][:3]} at once: the chief alone runs updates of server "
            "variables. Update them in separate ops: for a tf.cond, one applying the servers' "
            "variables' gradients and one the others' (optimizer.apply_gradients of each "
            "part), or use run_option='AR' or 'PS'")


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


# tf.cond applying updates of server variables: the chief runs it, the others' cut waits for
# its release, which waits for the step's aggregates on the servers as well as for the cond
# (runtime/steps.py): a cond taking its empty branch (lowered to Switch/Merge, it waits for
# nothing of the other) cannot release a step before every worker pushed its gradients.


def _check_no_server_writes_in_loops(analysis, server_writes) -> None:
    """Updates of server variables inside a while loop (or another function call than tf.cond)
    are refused: the chief would apply them a varying number of times in one step."""
    for name in server_writes:
        kind = analysis.function_calls.get(name)
        if kind and kind not in CONDITIONAL_OPS:
            raise ParallaxError(
                f"{name!r} (a TensorFlow {kind} op) updates variables that live on parameter "
                "servers inside its function (tf.while_loop, tf.function): in PS/HYBRID mode "
                "the chief applies a step's updates of server variables once, as ops of the "
                "graph or inside tf.cond. Apply the update after the loop, or use "
                "run_option='AR'")


def _partition_by_bytes(on_servers: List[VariablePlan], num_servers: int) -> None:
    """Largest first onto the least-loaded server (candidates.balance_by_bytes)."""
    servers = balance_by_bytes([(p.variable.name, p.variable.nbytes) for p in on_servers],
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


def batch_norms(analysis: GraphAnalysis) -> List[str]:
    """The batch norms of the graph in training mode, by the op computing their statistics:
    the mean of each tf.nn.moments over the batch, and each fused kernel."""
    return [mean for mean, _ in analysis.batch_moments] + list(analysis.fused_batch_norms)


def uses_collectives(run_option: str, analysis: GraphAnalysis, sync_batch_norm: bool) -> bool:
    """Whether the job's workers join the collectives: for dense gradients, batch statistics to
    combine, and in PS mode for the variables that stay replicated (per-worker state to
    average, replicas to broadcast)."""
    if run_option != "PS" or (sync_batch_norm and (analysis.batch_moments
                                                   or analysis.fused_batch_norms)):
        return True
    if analysis.averaged_writes or analysis.summed_writes:  # of a metric's variables, say
        return True
    if analysis.loss_denominators:
        return True
    return any(name not in analysis.variables and not _on_server_in_ps(analysis, name)
               for name in analysis.all_variables)


def _on_server_in_ps(analysis: GraphAnalysis, name: str) -> bool:
    state = analysis.extra_state.get(name)
    return state is not None and not state.per_worker and (
        state.owner is not None or state.after_gradients)
