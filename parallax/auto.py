"""run_option='AUTO' (and Config.search_partitions): before launching, the driver measures how
many rows each sparse gradient has on the first batches of the input (a probe session of the
graph as written), and the cost model (parallax/cost.py) picks how each variable is
synchronized, on which servers, and in how many shards parallax.get_partitioner's variables are
stored. The decision reaches every process of the job in its environment, so that all of them
build the same graph and plan.

The probe reads the input the graph reads itself (tf.data, as `parallax.shard` expects, or a
queue-based pipeline, whose queue runners it starts and stops); a graph fed through feed_dict
cannot be measured before it runs, and gets HYBRID's rule, as does one whose input the driver
waits for longer than PROBE_RUN_SECONDS, and one whose variables would take more than
PROBE_MEMORY_SHARE of the driver's free memory. The same
session times the training step of one worker alone (every update the graph makes from its
gradients, on one batch), for the predicted step time that `runner.describe()` reports.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import statistics
import time
from typing import Dict, List, Optional, Tuple

import numpy as np
import psutil
import tensorflow as tf

from parallax import cost
from parallax.analysis import (GraphAnalysis, gradient_sources, is_setting,
                               update_ops_by_variable, upstream_ops)
from parallax.capture import VARIABLE_OP_TYPES
from parallax.cluster import Cluster
from parallax.errors import ParallaxError
from parallax.graph_copy import copy_graph
from parallax.partitioner import (DECISION_ENV, Partitioned, partitioned_variables,
                                  shard_name)
from parallax.passes import row_sums, split_variables
from parallax.plan import rule
from parallax.profile import profiler_log_dropped, step_shares


@dataclasses.dataclass
class Decision:
    methods: Dict[str, dict]  # variable -> {"how": cost.ALLREDUCE/ALLGATHER/PS, "server": int}
    stats: Dict[str, dict]  # variable -> cost.VariableStats fields, as measured
    note: str  # how it was decided
    # Seconds of a worker's compute, its machine's cores shared (cost.shared_compute)
    compute: Optional[float] = None
    # Seconds of one worker's step alone, the speed of a server's updates (cost.step_time)
    alone: Optional[float] = None
    links: Optional[dict] = None  # cost.Links fields the decision assumed
    step: Optional[float] = None  # seconds of a step of the chosen plan, as predicted
    # With search_partitions: [call, variable, shards] for each call of get_partitioner
    partitions: List[list] = dataclasses.field(default_factory=list)
    # Allreduce in machine stages (Config.hierarchical_allreduce); None: not decided here
    machine_stages: Optional[bool] = None
    # [variable, shards] for each variable the workers split (passes/split_variables.py)
    splits: List[list] = dataclasses.field(default_factory=list)
    # The Config's run option it was made for: AUTO, or another whose servers and shards
    # (search_partitions, split_variables) were chosen here
    run_option: str = "AUTO"

    def to_env(self) -> Dict[str, str]:
        return {DECISION_ENV: json.dumps(dataclasses.asdict(self))}

    @classmethod
    def from_env(cls) -> "Decision":
        if DECISION_ENV not in os.environ:
            raise ParallaxError("run_option='AUTO' or search_partitions: this worker has no "
                                "decision from the driver; start the script itself (python "
                                "script.py), whose get_runner measures and launches the workers")
        return cls(**json.loads(os.environ[DECISION_ENV]))

    def link_model(self) -> cost.Links:
        return cost.Links(**self.links) if self.links else cost.Links()

    def variable_stats(self) -> Dict[str, cost.VariableStats]:
        return {name: cost.VariableStats(**{**fields, "unique": tuple(fields["unique"])})
                for name, fields in self.stats.items()}


def decide(graph: tf.Graph, analysis: GraphAnalysis, workers_per_machine: List[int],
           links: Optional[cost.Links] = None, run_option: str = "AUTO",
           search_partitions: bool = False,
           within_machine: Optional[cost.Links] = None,
           hierarchical_allreduce: Optional[bool] = None,
           split: Optional[bool] = None) -> Decision:
    """`links`: as measured between two machines (runner.link_probe); None: assumed.
    `within_machine`: the link probe's figures within one machine, for the record (the model
    prices the links between machines only). `hierarchical_allreduce`: the Config's; None
    (where the cluster allows machine stages) lets the cost model choose. Under
    another run option than AUTO the methods are its rule's, and only the servers, and with
    `search_partitions` the shards of parallax.get_partitioner's variables, are chosen.
    `split`: Config.split_variables; None lets the cost model split the variables the user did
    not partition, True splits every one a server holds that can be, over every machine."""
    shape = cost.Cluster(len(workers_per_machine), max(workers_per_machine))
    measured = links is not None
    links = links or cost.Links()
    needed, free = variables_bytes(graph), psutil.virtual_memory().available
    if needed > PROBE_MEMORY_SHARE * free:
        return _decision_by_rule(graph, analysis, run_option, split, shape, (
            f"the probe would allocate the graph's variables, {needed / 1e9:.3g} GB, more "
            f"than {PROBE_MEMORY_SHARE:.0%} of the driver's free memory ({free / 1e9:.3g} GB)"))
    try:
        with _probe_session(copy_graph(graph)) as session:
            stats, problem = measure(session, analysis, shape.workers)
            if not problem:
                timed, compute_problem = measure_compute(session, analysis)
                if timed:
                    stats = {name: dataclasses.replace(
                        var, ready=timed.ready.get(name, 1.0), update=timed.update.get(name, 0.0))
                        for name, var in stats.items()}
    except tf.errors.OpError as error:  # in the initializers
        stats, problem = {}, _probe_failure(error, "the graph could not be initialized")
    if problem:
        return _decision_by_rule(graph, analysis, run_option, split, shape, problem)
    summable = {v.name for v in analysis.sparse if all(
        row_sums.rows_can_be_summed(graph.get_tensor_by_name(r.values),
                                    graph.get_tensor_by_name(r.indices))
        for r in v.gradients if r.is_sparse)}
    hows = {} if run_option == "AUTO" else {
        name: rule(run_option, info).value for name, info in analysis.variables.items()}
    groups = partitioned_variables(graph) if search_partitions else []
    off_servers = _kept_off_servers(analysis) if run_option == "AUTO" else set()
    merged = _merge_shards(stats, groups, summable, hows, off_servers)
    counts = {group.name: range(group.min_partitions,
                                max(group.min_partitions, shape.machines) + 1)
              for group in groups}
    machines = [m for m, count in enumerate(workers_per_machine) for _ in range(count)]
    if not Cluster(machines).machine_groups():
        hierarchical_allreduce = False

    def choose(shard_counts):
        return cost.choose_with_allreduce_form(
            list(merged.values()), shape, links, hierarchical_allreduce,
            shard_counts=shard_counts, summable=summable, hows=hows, off_servers=off_servers)

    chosen, staged = choose(counts)
    splits, whole = {}, {}
    if split is not False:
        (chosen, staged), splits, whole = _choose_splits(
            graph, analysis, groups, off_servers, shape, split,
            lambda more: choose({**counts, **more}), (chosen, staged), merged, links)
    partitions = [[call, group.name, len(chosen[group.name].servers) or group.min_partitions]
                  for call, group in enumerate(groups)]
    chosen, stats = _split_shards(chosen, merged, groups + [
        Partitioned(name, [], 1) for name in splits])
    methods = {name: {"how": method.how, "server": method.servers[0] if method.servers
                      else None} for name, method in chosen.items()}
    note = (f"cost model: {shape.machines} machines x {shape.workers_per_machine} workers, "
            f"links {'measured' if measured else 'assumed'}: "
            f"{_rate(links.bandwidth)}, {links.latency * 1e6:.3g} us")
    if within_machine:
        note += (f" (within a machine {_rate(within_machine.bandwidth)}, "
                 f"{within_machine.latency * 1e6:.3g} us, not priced)")
    if partitions:
        note += "; partitions: " + ", ".join(f"{name} in {count}"
                                             for _, name, count in partitions)
    note += _splits_note(splits, whole)
    compute = alone = None
    if timed:
        alone = timed.alone
        cores = os.cpu_count() or 1  # the workers' machines taken to be like this one
        compute = cost.shared_compute(alone, timed.cpu, shape.workers_per_machine, cores)
        note += (f"; one worker's step alone {_ms(alone)} "
                 f"({_ms(timed.cpu)} of CPU), {shape.workers_per_machine} sharing "
                 f"{cores} cores {_ms(compute)}")
        off, held = cost.server_updates(chosen, stats, shape)
        if off:
            note += (f", of which the servers' updates take {off:.0%} (the busiest "
                     f"server {max(held):.0%})")
    else:
        note += f"; compute not measured ({compute_problem})"
    step = cost.step_time(chosen, stats, shape, links, compute=compute or 0.0, alone=alone,
                          hierarchical_allreduce=staged)
    note += (f"; predicted step {_ms(step)}" if timed
             else f"; predicted communication {_ms(step)} a step")
    return Decision(methods, {n: dataclasses.asdict(s) for n, s in stats.items()}, note,
                    compute, alone, dataclasses.asdict(links), step, partitions, staged,
                    [[name, count] for name, count in splits.items()], run_option)


def _decision_by_rule(graph, analysis, run_option, split, shape, problem) -> Decision:
    """Without measurements (`problem` says why): the run option's rule, HYBRID's for AUTO;
    with `split` True, its server variables split over every machine, in turn, the largest
    first (split_variables.splittable_in_turn)."""
    methods = {name: {"how": rule(run_option, info).value, "server": None}
               for name, info in analysis.variables.items()}
    splits, whole = {}, {}
    if split:
        counts, whole = _splittable_counts(graph, analysis, [], set(), shape)
        on_servers = [name for name in counts if methods[name]["how"] == cost.PS]
        if shape.machines < 2:
            whole.update(dict.fromkeys(on_servers, "the job has one machine"))
        else:
            kept, apart = split_variables.splittable_in_turn(graph, sorted(
                on_servers, key=lambda name: -analysis.variables[name].nbytes))
            splits, whole = dict.fromkeys(kept, shape.machines), {**whole, **apart}
    for name, count in splits.items():
        del methods[name]
        methods.update({shard_name(name, j): {"how": cost.PS, "server": j}
                        for j in range(count)})
    note = f"{_rule_name(run_option)}: {problem}" + _splits_note(splits, whole)
    return Decision(methods, {}, note, splits=[[n, k] for n, k in splits.items()],
                    run_option=run_option)


def _ms(seconds: float) -> str:
    """Milliseconds to two significant digits below 10 (a small model's step is 0.4 ms)."""
    milliseconds = 1000 * seconds
    return f"{milliseconds:.2g} ms" if milliseconds < 10 else f"{milliseconds:.0f} ms"


def _rate(bytes_per_second: float) -> str:
    megabits = bytes_per_second * 8 / 1e6
    return f"{megabits / 1000:.3g} Gbit/s" if megabits >= 1000 else f"{megabits:.3g} Mbit/s"


def _rule_name(run_option: str) -> str:
    return f"{'HYBRID' if run_option == 'AUTO' else run_option}'s rule"


def _kept_off_servers(analysis: GraphAnalysis) -> set:
    """Variables whose updates, or their extra state's (a moving average), the gradients wait
    for: make_plan refuses them on a server, where they would wait for the step's end."""
    writes = {name: set(info.update_ops) for name, info in analysis.variables.items()}
    for state in analysis.extra_state.values():
        if state.owner in writes:
            writes[state.owner].update(state.update_ops)
    return {name for name, ops in writes.items() if ops & analysis.before_gradients}


def _splits_note(splits: Dict[str, int], whole: Dict[str, str]) -> str:
    """The variables split over servers, and why those that cannot be split are kept whole."""
    note = "; split over servers: " + ", ".join(
        f"{name} in {count} shards" for name, count in splits.items()) if splits else ""
    if whole:
        note += "; kept whole: " + ", ".join(f"{name} ({why})" for name, why in whole.items())
    return note


def _pays(split, split_staged, whole, whole_staged, stats, shape, links) -> bool:
    """Whether the plan with split variables is predicted cost.SPLIT_MARGIN faster."""
    seconds = [cost.step_time(choice, stats, shape, links, hierarchical_allreduce=staged)
               for choice, staged in ((split, split_staged), (whole, whole_staged))]
    return seconds[0] * (1 + cost.SPLIT_MARGIN) < seconds[1]


def _choose_splits(graph, analysis, groups, off_servers, shape, split, choose, whole_plan,
                   merged, links):
    """The plan (methods, machine stages) with the variables the user did not partition split
    where the cost model predicts it pays (with `split` True, every one a server holds, over
    every machine), those splits, and why each other sparse variable is kept whole. Of those
    the plan splits that cannot split together, the largest are kept split in turn
    (split_variables.splittable_in_turn) and the plan is chosen again without the others.
    `choose` plans with extra shard counts; `whole_plan` is the plan without splits."""
    counts, whole = _splittable_counts(graph, analysis, groups, off_servers, shape)
    if split:  # those the plan puts on a server; the others keep the method chosen for them
        elsewhere = {name: whole_plan[0][name].how for name in counts
                     if whole_plan[0][name].how != cost.PS}
        whole.update({name: f"not on a server: {how}" for name, how in elsewhere.items()})
        counts = {name: range(shape.machines, shape.machines + 1) for name in counts
                  if name not in elsewhere}
    splits = {}
    while counts:  # each round keeps whole one more variable at least, or ends
        with_splits = choose(counts)
        splits = {name: len(with_splits[0][name].servers) for name in counts
                  if len(with_splits[0][name].servers) > 1}
        apart = split_variables.splittable_in_turn(
            graph, sorted(splits, key=lambda name: -merged[name].nbytes))[1]
        if not apart:
            break
        whole.update(apart)
        counts = {name: shards for name, shards in counts.items() if name not in apart}
    if splits and (split or _pays(*with_splits, *whole_plan, merged, shape, links)):
        return with_splits, splits, whole
    return whole_plan, {}, whole


def _splittable_counts(graph, analysis, groups, off_servers, shape
                       ) -> Tuple[Dict[str, range], Dict[str, str]]:
    """The shard counts the cost model may give each sparse variable the user did not
    partition (neither with parallax.get_partitioner nor with TensorFlow's partitioners): from
    1 to the number of machines, where the workers can split it (split_variables.splittable)
    and a server may hold it; and why each other one is kept whole."""
    partitioned = {name for group in groups for name in group.shards} | {
        v.op.name for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
        if getattr(v, "_save_slice_info", None) is not None}
    counts, whole = {}, {}
    for info in analysis.sparse:
        if info.name in partitioned:
            continue  # the user's own shards
        if info.name in off_servers:
            why = "the gradients wait for its updates, which keeps it off the servers"
        elif info.shape[0] <= 1:
            why = "it has one row"
        else:
            why = split_variables.splittable(graph, [info.name])
        if why is None:
            counts[info.name] = range(1, shape.machines + 1)
        else:
            whole[info.name] = why
    return counts, whole


def _merge_shards(stats, groups, summable, hows, off_servers) -> Dict[str, cost.VariableStats]:
    """The statistics with each partitioned variable whole: the cost model chooses its
    method and number of shards (of the same rows, 1/k to each)."""
    merged = dict(stats)
    for group in groups:
        shards = [merged.pop(name) for name in group.shards]
        first = shards[0]
        merged[group.name] = dataclasses.replace(
            first, name=group.name, nbytes=sum(s.nbytes for s in shards),
            rows=None if not first.sparse else sum(s.rows for s in shards),
            unique=tuple(map(sum, zip(*(s.unique for s in shards)))),
            ready=max(s.ready for s in shards), update=sum(s.update for s in shards))
        if all(name in summable for name in group.shards):
            summable.add(group.name)
        if group.shards[0] in hows:
            hows[group.name] = hows[group.shards[0]]
        if off_servers.intersection(group.shards):
            off_servers.add(group.name)
    return merged


def _split_shards(chosen, merged, groups):
    """Methods and statistics per shard of the partitioned variables (and of those the workers
    will split): k shards, the jth on the jth server chosen; each shard 1/k of the variable."""
    chosen, stats = dict(chosen), dict(merged)
    for group in groups:
        method, whole = chosen.pop(group.name), stats.pop(group.name)
        count = len(method.servers) or group.min_partitions
        for j in range(count):
            name = shard_name(group.name, j)
            chosen[name] = cost.Method(method.how, method.servers[j:j + 1])
            stats[name] = dataclasses.replace(
                whole, name=name, nbytes=whole.nbytes // count,
                rows=None if not whole.sparse else whole.rows // count,
                unique=tuple(u // count for u in whole.unique), update=whole.update / count)
    return chosen, stats


@dataclasses.dataclass(frozen=True)
class Timing:
    """One worker's training step alone, as the probe measured it."""
    alone: float  # seconds of wall time
    cpu: float  # seconds of this process's CPU time
    ready: Dict[str, float]  # per variable, cost.VariableStats.ready
    update: Dict[str, float]  # per variable, cost.VariableStats.update


def measure_compute(session: tf.compat.v1.Session, analysis: GraphAnalysis, steps: int = 3
                    ) -> Tuple[Optional[Timing], Optional[str]]:
    """One training step on one worker's batch alone (every update the graph makes from its
    gradients), run after one warm-up step: the medians of `steps` of its wall and CPU time,
    and when each gradient is ready and each variable's update's share, from one more, traced
    (profile.step_shares). Or why it cannot."""
    writes = list(dict.fromkeys(analysis.training_writes))
    fed = _fed_placeholders(session.graph, writes)
    # A rate's value (a float setting) or is_training's does not change how much a step
    # computes: 1 (True: training) times it. An integer one may size the batch.
    data = [op.name for op in fed if not is_setting(op)
            or not (op.outputs[0].dtype.is_floating or op.outputs[0].dtype == tf.bool)]
    if data:
        return None, f"the step needs {data[0]!r} fed"
    settings = {op.outputs[0]: np.ones((), op.outputs[0].dtype.as_numpy_dtype) for op in fed}
    seconds, cpu_seconds = [], []
    metadata = tf.compat.v1.RunMetadata()
    try:
        for _ in range(steps + 1):
            start, cpu_start = time.perf_counter(), time.process_time()
            session.run(writes, settings)
            seconds.append(time.perf_counter() - start)
            cpu_seconds.append(time.process_time() - cpu_start)
        with profiler_log_dropped():
            session.run(writes, settings, options=tf.compat.v1.RunOptions(
                trace_level=tf.compat.v1.RunOptions.FULL_TRACE), run_metadata=metadata)
    except (tf.errors.OpError, ValueError) as error:  # ValueError: an update in a tf.cond
        return None, _probe_failure(error, "the step could not run before the job")
    graph = session.graph
    ready, update = step_shares(metadata.step_stats, gradient_sources(graph, analysis),
                                update_ops_by_variable(graph, analysis))
    return Timing(statistics.median(seconds[1:]), statistics.median(cpu_seconds[1:]), ready,
                  update), None


def measure(session: tf.compat.v1.Session, analysis: GraphAnalysis,
            batches: int) -> Tuple[Dict[str, cost.VariableStats], Optional[str]]:
    """Each variable's statistics; for a sparse one the ids its gradients carry in `batches`
    consecutive batches (as many as the job's workers take in one step). Or why it cannot."""
    sparse = {v.name: [session.graph.get_tensor_by_name(r.indices) for r in v.gradients
                       if r.is_sparse] for v in analysis.sparse}
    ids: Dict[str, List[np.ndarray]] = {name: [] for name in sparse}
    fed = _fed_placeholders(session.graph, [t.op.name for ts in sparse.values() for t in ts])
    if fed:
        return {}, f"the input comes through feed_dict ({fed[0].name!r})"
    try:
        for _ in range(batches if sparse else 0):
            for name, values in session.run(sparse).items():
                ids[name].append(np.concatenate([v.ravel() for v in values]))
    except tf.errors.InvalidArgumentError as error:
        return {}, f"the input could not be read before the job ({_reason(error.message)})"
    except (tf.errors.OpError, ValueError) as error:  # ValueError: ids in a loop's body
        return {}, _probe_failure(error, "the probe of the input failed")
    stats = {}
    for info in analysis.variables.values():
        if info.name not in ids:
            stats[info.name] = cost.VariableStats(info.name, info.nbytes)
            continue
        batches_ids = ids[info.name]
        seen, unique = set(), []
        for batch in batches_ids:
            seen.update(batch.tolist())
            unique.append(len(seen))
        row_bytes = info.nbytes // max(info.shape[0], 1)
        stats[info.name] = cost.VariableStats(
            info.name, info.nbytes, rows=int(np.mean([len(b) for b in batches_ids])),
            row_bytes=row_bytes, index_bytes=sparse[info.name][0].dtype.size,
            unique=tuple(unique))
    return stats, None


# The probe allocates every variable of the graph in the driver; a model larger than this share
# of its free memory (a table sharded because no single machine holds it) is not measured.
PROBE_MEMORY_SHARE = 0.5


def variables_bytes(graph: tf.Graph) -> int:
    """Bytes of every variable the graph creates, optimizer slots included, as a session of it
    allocates them (a variable of unknown shape counts nothing)."""
    total = 0
    for op in graph.get_operations():
        if op.type in VARIABLE_OP_TYPES:
            shape = tf.TensorShape(op.get_attr("shape"))
            if shape.is_fully_defined():
                total += shape.num_elements() * tf.as_dtype(op.get_attr("dtype")).size
    return total


# A probe run waiting longer than this waits for input the driver cannot read (a queue that
# only the workers' code fills, a socket): the launch goes on without the measurement.
PROBE_RUN_SECONDS = 120


@contextlib.contextmanager
def _probe_session(graph: tf.Graph):
    """A session of a copy of the graph as written (graph_copy: its devices within one task,
    as a graph written for TensorFlow's parameter servers names jobs this driver has not), in
    the driver, as a worker's runner would start it:
    variables, local variables and tables initialized, queue runners (shuffle_batch,
    string_input_producer) started, and stopped at exit."""
    initializers = [v.initializer for v in graph.get_collection(
        tf.compat.v1.GraphKeys.GLOBAL_VARIABLES) + graph.get_collection(
        tf.compat.v1.GraphKeys.LOCAL_VARIABLES)]
    initializers += graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS)
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True,
                                      operation_timeout_in_ms=PROBE_RUN_SECONDS * 1000)
    coordinator, threads = tf.compat.v1.train.Coordinator(), []
    with tf.compat.v1.Session(graph=graph, config=config) as session:
        session.run(initializers)
        if graph.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS):  # else TF's warning
            with graph.as_default():
                threads = tf.compat.v1.train.start_queue_runners(session, coord=coordinator,
                                                                 daemon=True)
        try:
            yield session
        finally:
            coordinator.request_stop()
            coordinator.join(threads, stop_grace_period_secs=10)


def _fed_placeholders(graph: tf.Graph, op_names: List[str]) -> List[tf.Operation]:
    """The placeholders without a default that the ops named wait for (by data or control):
    what only the user's feed_dict gives, which a probe run would fail without (and
    TensorFlow log its failure into the user's output)."""
    ops = [graph.get_operation_by_name(name) for name in op_names]
    return sorted((op for op in {*ops, *upstream_ops(ops)} if op.type == "Placeholder"),
                  key=lambda op: op.name)


def _probe_failure(error: Exception, failed: str) -> str:
    """Why a probe run failed: a TensorFlow error, or a fetch TensorFlow refused (ValueError:
    a tensor inside a tf.cond or a loop's body)."""
    if isinstance(error, tf.errors.DeadlineExceededError):
        return (f"{failed}: a run waited more than {PROBE_RUN_SECONDS} s (for input only the "
                "workers can read?)")
    message = error.message if isinstance(error, tf.errors.OpError) else str(error)
    return f"{failed}: {_reason(message)}"


def _reason(message: str) -> str:
    """The line of a TensorFlow error that says what went wrong: not its heading ("Graph
    execution error:"), the stack where the op was defined, nor the node's name."""
    lines = [line for line in message.splitlines() if line.strip()]
    said = [line for line in lines if not line[0].isspace() and not line.startswith((
        "Graph execution error", "Detected at node", "Node:"))]
    return (said or lines or [message])[0]
