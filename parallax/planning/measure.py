"""Measurement, the driver's stage before planning: what one worker's step does on the real
input, in a probe session of the graph as written — how many rows each sparse gradient carries
in the batches of one step of the job, how long one worker's step takes alone and when each
gradient is ready in it — beside the links the driver measured between its machines
(runner.link_probe). It returns what it measured, or why it could not, and decides nothing.

The probe reads the input the graph reads itself (tf.data, as `parallax.shard` expects, or a
queue-based pipeline, whose queue runners it starts and stops); a graph fed through feed_dict
cannot be measured before it runs, nor one whose input the driver waits for longer than
PROBE_RUN_SECONDS, nor one whose variables would take more than PROBE_MEMORY_SHARE of the
driver's free memory.
"""
from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import psutil
import tensorflow as tf

from parallax.planning import cost
from parallax.planning.problem import Cores
from parallax.planning.analysis import GraphAnalysis, gradient_sources, update_ops_by_variable
from parallax.planning.traces import profiler_log_dropped, step_shares
from parallax.vocabulary import (ITERATOR_GET_NEXT_OPS, VARIABLE_OP_TYPES, is_setting,
                                 start_queue_runners, upstream_ops)
from parallax.graph_copy import copy_graph


@dataclasses.dataclass
class Measurements:
    """What the driver measured before planning; `problem` says why the rows were not."""
    workers_per_machine: List[int]
    links: Optional[cost.Links] = None  # between two machines; None: not measured
    within_machine: Optional[cost.Links] = None  # within one machine, for the record
    cores: Optional[Cores] = None  # None: not measured, the driver's own taken for each
    stats: Dict[str, cost.VariableStats] = dataclasses.field(default_factory=dict)
    timing: Optional["Timing"] = None  # one worker's step alone
    problem: Optional[str] = None  # why the statistics were not measured
    compute_problem: Optional[str] = None  # why the step was not timed
    transport: Optional[cost.Transport] = None  # TensorFlow's gRPC, probed; None: not
    collective: Optional[cost.Collective] = None  # the job's collectives, probed; None: not

    @property
    def shape(self) -> cost.Shape:
        return cost.Shape(len(self.workers_per_machine), max(self.workers_per_machine))

    @property
    def fed(self) -> bool:
        """Whether the problem is that the input comes from the script's feed_dict."""
        return bool(self.problem and self.problem.startswith(FED))


def measure(graph: tf.Graph, analysis: GraphAnalysis, workers_per_machine: List[int],
            links: Optional[cost.Links] = None,
            within_machine: Optional[cost.Links] = None,
            cores: Optional[Cores] = None,
            before_timing: Callable[[], None] = lambda: None) -> Measurements:
    """The probe of `graph` for a job of `workers_per_machine`, with the links and cores
    measured. `before_timing()` returns when the step may be timed alone (other probes
    done)."""
    measured = Measurements(workers_per_machine, links, within_machine, cores,
                            problem=unmeasurable(graph, analysis))
    if measured.problem:
        return measured
    try:
        with _probe_session(copy_graph(graph)) as session:
            measure_in(session, analysis, measured, before_timing=before_timing)
    except tf.errors.OpError as error:  # in the initializers
        measured.problem = _probe_failure(error, "the graph could not be initialized")
    return measured


def unmeasurable(graph: tf.Graph, analysis: GraphAnalysis) -> Optional[str]:
    """Why the probe cannot measure `graph`, told without running it, or None: its variables
    would take more than PROBE_MEMORY_SHARE of the driver's free memory, or its sparse
    gradients' ids come through feed_dict."""
    needed, free = variables_bytes(graph), psutil.virtual_memory().available
    if needed > PROBE_MEMORY_SHARE * free:
        return (f"the probe would allocate the graph's variables, {needed / 1e9:.3g} GB, more "
                f"than {PROBE_MEMORY_SHARE:.0%} of the driver's free memory ({free / 1e9:.3g} GB)")
    fed = _fed_placeholders(graph, [graph.get_tensor_by_name(r.indices).op.name
                                    for v in analysis.sparse for r in v.gradients
                                    if r.is_sparse])
    return f"{FED} ({fed[0].name!r})" if fed else None


def measure_in(session: tf.compat.v1.Session, analysis: GraphAnalysis,
               measured: Measurements, feeds: Sequence[dict] = (),
               before_timing: Callable[[], None] = lambda: None) -> None:
    """The rows and the step, measured in a probe session into `measured`; `feeds`: the
    feed_dicts of the script's own first training steps, for a graph fed through feed_dict."""
    stats, measured.problem = measure_rows(session, analysis, measured.shape.workers, feeds)
    if not measured.problem:
        before_timing()
        measured.timing, measured.compute_problem = measure_compute(
            session, analysis, feed=feeds[0] if feeds else None)
        if measured.timing:
            timed = measured.timing
            stats = {name: dataclasses.replace(
                var, ready=timed.ready.get(name, 1.0), update=timed.update.get(name, 0.0))
                for name, var in stats.items()}
    measured.stats = stats


@dataclasses.dataclass(frozen=True)
class Timing:
    """One worker's training step alone, as the probe measured it."""
    alone: float  # seconds of wall time
    cpu: float  # seconds of this process's CPU time
    ready: Dict[str, float]  # per variable, cost.VariableStats.ready
    update: Dict[str, float]  # per variable, cost.VariableStats.update


def measure_compute(session: tf.compat.v1.Session, analysis: GraphAnalysis, steps: int = 3,
                    feed: Optional[dict] = None) -> Tuple[Optional[Timing], Optional[str]]:
    """One training step on one worker's batch alone (every update the graph makes from its
    gradients), run after one warm-up step: the medians of `steps` of its wall and CPU time,
    and when each gradient is ready and each variable's update's share, from one more, traced
    (profile.step_shares). Or why it cannot."""
    writes = list(dict.fromkeys(analysis.training_writes))
    given = {_name(key) for key in feed or {}}
    fed = [op for op in _fed_placeholders(session.graph, writes)
           if op.outputs[0].name not in given]
    # A rate's value (a float setting) or is_training's does not change how much a step
    # computes: 1 (True: training) times it. An integer one may size the batch.
    data = [op.name for op in fed if not is_setting(op)
            or not (op.outputs[0].dtype.is_floating or op.outputs[0].dtype == tf.bool)]
    if data:
        return None, f"the step needs {data[0]!r} fed"
    settings = {**(feed or {}), **{op.outputs[0]: np.ones((), op.outputs[0].dtype.as_numpy_dtype)
                                   for op in fed}}
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


def measure_rows(session: tf.compat.v1.Session, analysis: GraphAnalysis, batches: int,
                 feeds: Sequence[dict] = ()) -> Tuple[Dict[str, cost.VariableStats],
                                                      Optional[str]]:
    """Each variable's statistics; for a sparse one the ids its gradients carry in `batches`
    consecutive batches (as many as the job's workers take in one step; with `feeds`, those
    fed, in turn). Or why it cannot."""
    sparse = {v.name: [session.graph.get_tensor_by_name(r.indices) for r in v.gradients
                       if r.is_sparse] for v in analysis.sparse}
    ids: Dict[str, List[np.ndarray]] = {name: [] for name in sparse}
    try:
        for batch in range(batches if sparse else 0):
            feed = feeds[batch % len(feeds)] if feeds else None
            for name, values in session.run(sparse, feed).items():
                ids[name].append(np.concatenate([v.ravel() for v in values]))
    except tf.errors.InvalidArgumentError as error:
        return {}, f"the input could not be read before the job ({error_reason(error.message)})"
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
            unique=tuple(unique), table_rows=info.shape[0])
    return stats, None


FED = "the input comes through feed_dict"  # Measurements.problem of a graph fed by the script


def _name(key) -> str:
    """A feed_dict's key as the name of the tensor it feeds."""
    return key if isinstance(key, str) else key.name


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
    string_input_producer) started, and stopped at exit; initializable iterators initialized
    as the script would before its first step (_iterator_initializers)."""
    initializers = [v.initializer for v in graph.get_collection(
        tf.compat.v1.GraphKeys.GLOBAL_VARIABLES) + graph.get_collection(
        tf.compat.v1.GraphKeys.LOCAL_VARIABLES)]
    initializers += graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS)
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True,
                                      operation_timeout_in_ms=PROBE_RUN_SECONDS * 1000)
    coordinator = tf.compat.v1.train.Coordinator()
    with tf.compat.v1.Session(graph=graph, config=config) as session:
        session.run(initializers)
        session.run(_iterator_initializers(graph))
        threads = start_queue_runners(graph, session, coordinator)
        try:
            yield session
        finally:
            coordinator.request_stop()
            coordinator.join(threads, stop_grace_period_secs=10)


def _iterator_initializers(graph: tf.Graph) -> List[tf.Operation]:
    """Each initializable iterator's first initializer (MakeIterator) that needs nothing fed:
    the training dataset's, where a reinitializable iterator has one per dataset and the
    script initializes the training one first."""
    first = {}
    for op in graph.get_operations():
        if op.type == "MakeIterator" and not _fed_placeholders(graph, [op.name]):
            first.setdefault(op.inputs[1].op.name, op)
    return list(first.values())


def probe_session(graph: tf.Graph):
    """A session of `graph` itself, as the probe starts it (_probe_session)."""
    return _probe_session(graph)


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
    return f"{failed}: {error_reason(message)}"


def error_reason(message: str) -> str:
    """The line of a TensorFlow error that says what went wrong: not its heading ("Graph
    execution error:"), the stack where the op was defined, nor the node's name."""
    lines = [line for line in message.splitlines() if line.strip()]
    said = [line for line in lines if not line[0].isspace() and not line.startswith((
        "Graph execution error", "Detected at node", "Node:"))]
    return (said or lines or [message])[0]


def input_batch(graph: tf.Graph) -> Tuple[Optional[int], Optional[str]]:
    """The examples of one batch of the graph's input: the first dimension of the first
    tensor its tf.data iterator gives (read in a probe session where the graph does not
    say); or why it cannot be told."""
    nexts = [op for op in graph.get_operations() if op.type in ITERATOR_GET_NEXT_OPS]
    if not nexts:
        return None, "the graph reads no tf.data iterator"
    first = nexts[0].outputs[0]
    if first.shape.rank and tf.compat.dimension_value(first.shape[0]) is not None:
        return tf.compat.dimension_value(first.shape[0]), None  # a Dimension under TF1
    copied = copy_graph(graph)
    try:
        with _probe_session(copied) as session:
            value = session.run(copied.get_tensor_by_name(first.name))
    except tf.errors.OpError as error:
        return None, _probe_failure(error, "the input could not be read")
    if not np.ndim(value):
        return None, f"{first.name!r} is a scalar"
    return int(np.shape(value)[0]), None
