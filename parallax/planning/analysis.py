"""Analysis: from the recorded gradients, what each variable is and what updates it.

Everything here is read from the graph itself (the capture collection, op types, colocation
attributes), so it works on a graph imported from a MetaGraphDef as well as on one just built.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Dict, List, Optional, Set, Tuple

import numpy as np
import tensorflow as tf

from parallax import contracts, tf_private
from parallax.capture import batch_moments
from parallax.contracts import GradientRecord, read_tables
from parallax.errors import ParallaxError
from parallax.planning import counters
from parallax.planning.problem import whole_name
from parallax.vocabulary import (DATA_SOURCE_OPS, DIVIDING_OPS, FUNCTION_CALL_OPS,
                                 PLACEHOLDER_OPS, RESTORE_OP_TYPES, SHAPE_ONLY_OPS,
                                 STATEFUL_RANDOM_OP_TYPES, VARIABLE_OP_TYPES, downstream_ops,
                                 initializer_op, is_setting, parents, upstream_ops, walk)

# Fused optimizer updates write every variable they take (the variable and its slots);
# assignments and scatters write their first input.
_FUSED_UPDATE_PREFIXES = ("Apply", "SparseApply", "ResourceApply", "ResourceSparseApply")
_ASSIGN_PREFIXES = ("Assign", "ResourceScatter", "Scatter")


@dataclasses.dataclass
class VariableInfo:
    name: str  # the variable's op name
    dtype: tf.DType
    shape: Tuple[int, ...]
    gradients: List[GradientRecord]
    update_ops: List[str]
    # A dense variable that the forward pass also gathers rows of (an embedding): the ops that
    # read its whole value beside the gathers (an l2_loss, a tied output layer's matmul), as
    # (type, name). Their gradient terms are dense, so autodiff sums the rows into a dense
    # gradient of the whole variable: what makes it dense, for describe() to say.
    whole_reads: List[Tuple[str, str]] = dataclasses.field(default_factory=list)

    @property
    def is_sparse(self) -> bool:
        return any(record.is_sparse for record in self.gradients)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.size


@dataclasses.dataclass
class ExtraState:
    """A variable without a gradient that training writes: optimizer slots, beta powers,
    moving averages, accumulators, global_step, moving statistics."""

    name: str
    owner: Optional[str]  # the trainable variable it lives with (TF's colocation), if any
    update_ops: List[str]
    # Written from this worker's own data (a loss average, a batch's moving statistics): the
    # replicas would drift apart, so the value each write takes is averaged over workers, or
    # summed where it adds a count of the batch (planning/counters.py).
    per_worker: bool = False
    # Written from the gradients (slots, global_step, accumulators), not before or beside them.
    after_gradients: bool = False


@dataclasses.dataclass
class GraphAnalysis:
    """What `analyze` read of a graph: every stage after it plans and rewrites from this."""
    variables: Dict[str, VariableInfo]  # in recording order
    extra_state: Dict[str, ExtraState]
    update_reads: Dict[str, set]  # variable -> the variables its update ops read
    all_variables: List[str] = dataclasses.field(default_factory=list)  # global, by op name
    # Writes that are function calls (tf.cond applying an update): name -> op type.
    function_calls: Dict[str, str] = dataclasses.field(default_factory=dict)
    # (mean, variance) op names of each batch's moments (tf.nn.moments over the batch axis).
    batch_moments: List[Tuple[str, str]] = dataclasses.field(default_factory=list)
    fused_batch_norms: List[str] = dataclasses.field(default_factory=list)  # in training mode
    # Training writes the gradients wait for (a control dependency or a data path: an EMA in
    # UPDATE_OPS before minimize): no parameter server may hold what they write.
    before_gradients: Set[str] = dataclasses.field(default_factory=set)
    # Variables whose gradient another gradient is computed from (a penalty on the gradients,
    # differentiated again: double backprop).
    differentiated: List[str] = dataclasses.field(default_factory=list)
    # Writes of per-worker state that add a count of the batch: summed over workers.
    summed_writes: List[str] = dataclasses.field(default_factory=list)
    # Adding writes of per-worker state whose increment is neither a count of the batch nor a
    # per-step value that Parallax can tell: (write, variable), averaged.
    unclear_counters: List[Tuple[str, str]] = dataclasses.field(default_factory=list)
    # A loss divided by a sum over the batch (the tokens that are not padding; the weights of
    # SUM_BY_NONZERO_WEIGHTS): those denominators' tensors, which one device takes over the
    # combined batch; and the divisions of a loss by a value of the worker's data that is
    # neither such a sum nor a per-step value (op names).
    loss_denominators: List[str] = dataclasses.field(default_factory=list)
    unclear_denominators: List[str] = dataclasses.field(default_factory=list)
    # Training writes inside a tf.cond of v1 control flow (TF1 behaviour): write -> the cond,
    # which applies them together as a tf.cond of v2 does in one If op.
    in_v1_cond: Dict[str, str] = dataclasses.field(default_factory=dict)

    def inputs_of_updates(self, variable: str) -> set:
        return self.update_reads.get(variable, set())

    @property
    def dense(self) -> List[VariableInfo]:
        return [v for v in self.variables.values() if not v.is_sparse]

    @property
    def sparse(self) -> List[VariableInfo]:
        return [v for v in self.variables.values() if v.is_sparse]

    @property
    def training_writes(self) -> List[str]:
        """Every write the graph makes from its gradients: updates of variables, and of
        their extra state."""
        return [op for info in self.variables.values() for op in info.update_ops] + [
            op for state in self.extra_state.values() for op in state.update_ops]

    @property
    def averaged_writes(self) -> List[str]:
        """Writes whose value is averaged over workers: those of per-worker state but the
        summed ones."""
        return [op for state in self.extra_state.values() if state.per_worker
                for op in state.update_ops if op not in self.summed_writes]


def analyze(graph: tf.Graph) -> GraphAnalysis:
    """What training `graph` means for each of its variables, from the gradients capture
    recorded: the trained variables and their update ops, the extra state training writes
    beside them, which writes are each worker's own (averaged or summed over workers), and the
    batch norms and losses to take over the combined batch. Raises ParallaxError for a graph
    Parallax cannot train as one device would."""
    records = _recorded_gradients(graph)
    writes = _training_writes(graph)
    gradients = _GradientOps.of(graph, records)
    _check_gradients_are_applied(graph, records, writes)
    variables = _trained_variables(graph, records, writes)
    from_data = _per_worker_ops(graph, gradients.names, settings=False)
    extra_state = _extra_state(graph, writes, variables, gradients, from_data)
    _check_trained_variables_not_written_from_the_batch(graph, variables, gradients.ahead,
                                                       gradients.names)
    sizes = counters.batch_sizes(op for op in graph.get_operations()
                                 if op.type in DATA_SOURCE_OPS and not is_setting(op))
    summed, unclear = _counters(graph, extra_state, from_data, sizes)
    forward = _forward(graph)
    for info in variables.values():
        if not info.is_sparse:
            info.whole_reads = _whole_reads(graph.get_operation_by_name(info.name), forward)
    trained = _data_downstream([graph.get_operation_by_name(n) for n in variables],
                               stop=gradients.names, values_only=True)
    denominators, unclear_denominators = _loss_denominators(forward, trained, from_data, sizes)
    return GraphAnalysis(
        variables=variables, extra_state=extra_state,
        update_reads={name: _variables_read(graph, info.update_ops, gradients.ops)
                      for name, info in variables.items()},
        all_variables=[v.op.name for v in
                       graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)],
        function_calls=_function_calls(graph, writes), batch_moments=batch_moments(graph),
        fused_batch_norms=_fused_batch_norms(graph),
        before_gradients={w for ops in writes.values() for w in ops
                          if graph.get_operation_by_name(w) in gradients.ahead},
        differentiated=_differentiated(graph, records, writes), summed_writes=summed,
        unclear_counters=unclear, loss_denominators=denominators,
        unclear_denominators=unclear_denominators, in_v1_cond=_in_v1_cond(graph, writes))


def _recorded_gradients(graph: tf.Graph) -> List[GradientRecord]:
    records = contracts.read_gradients(graph)
    if not records:
        raise ParallaxError(
            "the graph has no recorded gradients: `import parallax` before building the "
            "graph, then compute gradients with tf.compat.v1.gradients or a "
            "tf.compat.v1.train.Optimizer (minimize / compute_gradients) inside that graph")
    return records


@dataclasses.dataclass(frozen=True)
class _GradientOps:
    """The recorded gradients' ops, their tensors' names, and the ops before and after them."""
    ops: Set[tf.Operation]
    names: Set[str]
    ahead: Set[tf.Operation]  # what the gradients are computed from
    after: Set[str]  # names of the ops computed from them

    @classmethod
    def of(cls, graph: tf.Graph, records: List[GradientRecord]) -> "_GradientOps":
        tensors = [graph.get_tensor_by_name(name) for r in records for name in r.tensor_names()]
        ops = {t.op for t in tensors}
        return cls(ops, {t.name for t in tensors}, upstream_ops(ops),
                   {op.name for op in downstream_ops(ops)})


def _trained_variables(graph: tf.Graph, records: List[GradientRecord],
                       writes: Dict[str, List[str]]) -> Dict[str, VariableInfo]:
    """The variables with a recorded gradient, in recording order."""
    by_variable: Dict[str, List[GradientRecord]] = collections.OrderedDict()
    for record in records:
        by_variable.setdefault(record.variable, []).append(record)
    variables = collections.OrderedDict()
    for name, grads in by_variable.items():
        op = graph.get_operation_by_name(name)
        shape = tf.TensorShape(op.get_attr("shape"))
        if not shape.is_fully_defined():
            raise ParallaxError(
                f"variable {name!r} has a gradient but no static shape ({shape}): Parallax "
                "sizes its aggregation and placement by it; create it with a fully defined "
                "shape")
        variables[name] = VariableInfo(name=name, dtype=tf.as_dtype(op.get_attr("dtype")),
                                       shape=tuple(shape.as_list()), gradients=grads,
                                       update_ops=writes.get(name, []))
    return variables


def _extra_state(graph: tf.Graph, writes: Dict[str, List[str]],
                 variables: Dict[str, VariableInfo], gradients: _GradientOps,
                 from_data: set) -> Dict[str, ExtraState]:
    """Every variable training writes that has no gradient of its own; `from_data`: the ops
    computed from a worker's own data, not from its settings."""
    per_worker_ops = _per_worker_ops(graph, gradients.names)
    extra_state = collections.OrderedDict()
    for name, write_ops in writes.items():
        if name in variables:
            continue
        _check_not_an_uncaptured_update(graph, name, write_ops)
        # A fused update (a slot's) of a setting (a fed learning rate) writes what every
        # worker writes; an assignment of one is averaged all the same.
        per_worker = [w for w in write_ops if w in per_worker_ops and (
            w in from_data or graph.get_operation_by_name(w).type in _AVERAGEABLE_WRITES)]
        for write in per_worker:
            _check_averageable(graph, write, name)
        extra_state[name] = ExtraState(
            name, _colocated_variable(graph, name, variables), write_ops,
            per_worker=bool(per_worker),
            after_gradients=any(w in gradients.after for w in write_ops))
    return extra_state


def _forward(graph: tf.Graph) -> Set[tf.Operation]:
    """The ops that compute the differentiated losses."""
    losses = [graph.get_tensor_by_name(name).op for name in contracts.read_losses(graph)]
    return upstream_ops(losses) | set(losses)


def _function_calls(graph: tf.Graph, writes: Dict[str, List[str]]) -> Dict[str, str]:
    kinds = {w: graph.get_operation_by_name(w).type for ops in writes.values() for w in ops}
    return {write: kind for write, kind in kinds.items() if kind in FUNCTION_CALL_OPS}


def _fused_batch_norms(graph: tf.Graph) -> List[str]:
    return [op.name for op in graph.get_operations()
            if op.type.startswith("FusedBatchNorm")
            and not op.type.startswith("FusedBatchNormGrad") and op.get_attr("is_training")]


# Reads of a variable's rows: their gradient is the rows' alone (IndexedSlices).
_ROW_GATHERS = frozenset({"ResourceGather", "GatherV2", "Gather"})
# Ops that pass a variable's whole value on, read or not (TF1's "var/read" Identity).
_VALUE_PASSING = frozenset({"ReadVariableOp", "Identity"})


def _whole_reads(variable: tf.Operation, forward: Set[tf.Operation]) -> List[Tuple[str, str]]:
    """VariableInfo.whole_reads of `variable`: empty unless `forward` (the ops computing the
    losses) also gathers rows of it."""
    def consumers_in_forward(op):
        return [c for out in op.outputs for c in out.consumers() if c in forward]

    passing = set(walk([variable], lambda op: [c for c in consumers_in_forward(op)
                                               if c.type in _VALUE_PASSING]))
    readers = {c for op in passing for c in consumers_in_forward(op)} - passing
    gathers = {op for op in readers if op.type in _ROW_GATHERS and op.inputs[0].op in passing
               and (op.type != "GatherV2" or tf.get_static_value(op.inputs[2]) == 0)}
    return sorted(((op.type, op.name) for op in readers - gathers),
                  key=lambda read: read[1]) if gathers else []


def _in_v1_cond(graph: tf.Graph, writes: Dict[str, List[str]]) -> Dict[str, str]:
    found = {}
    for name in (w for ops in writes.values() for w in ops):
        context = tf_private.control_flow_context(graph.get_operation_by_name(name))
        while context is not None and not context.IsCondContext():
            context = context.outer_context
        if context is not None:
            found[name] = context.name
    return found


def _loss_denominators(forward: Set[tf.Operation], trained: set, from_data: set,
                       sizes: Set[int]) -> Tuple[List[str], List[str]]:
    """Of the ops that compute the differentiated losses (`forward`), the scalar divisions of a
    sum over the batch computed from the trained variables: the denominators that are sums over
    the batch too (tensor names), and the divisions by another value of the worker's data (op
    names). A denominator computed from the variables is the model's own, not the batch's."""
    counted, unclear = [], []
    for op in sorted(forward, key=lambda op: op.name):
        if op.type not in DIVIDING_OPS or op.outputs[0].shape.rank != 0:
            continue
        numerator, denominator = op.inputs[:2]
        if (numerator.op.name not in trained or denominator.op.name not in from_data
                or denominator.op.name in trained or counters.tensor_kind(
                    numerator, from_data, sizes) is not counters.Increment.COUNT):
            continue
        kind = counters.tensor_kind(denominator, from_data, sizes)
        if kind is counters.Increment.COUNT:
            counted.append(denominator.name)
        elif kind is counters.Increment.UNCLEAR:
            unclear.append(op.name)
    return list(dict.fromkeys(counted)), unclear


def _counters(graph: tf.Graph, extra_state: Dict[str, ExtraState], from_data: set,
              sizes: Set[int]) -> Tuple[List[str], List[Tuple[str, str]]]:
    """The adding writes of per-worker state that count the batch (summed over workers), and
    those Parallax cannot tell (write, variable); `sizes` the input's known leading sizes."""
    summed, unclear = [], []
    for state in extra_state.values():
        for name in state.update_ops:
            write = graph.get_operation_by_name(name)
            if write.type not in counters.ADDING_WRITES:
                continue
            kind = counters.increment_kind(write, from_data, sizes)
            if kind is counters.Increment.COUNT:
                summed.append(name)
                state.per_worker = True  # a count of a fixed batch: constant, yet the worker's
            elif kind is counters.Increment.UNCLEAR:
                unclear.append((name, state.name))
    return summed, unclear


def _differentiated(graph: tf.Graph, records: List[GradientRecord], writes) -> List[str]:
    """Variables one of whose recorded gradients flows, as a value, into another recorded
    gradient (of any variable, its own too); the walk stops at training writes, beyond which
    lies what a step computes after its updates."""
    written = {t.name for ops in writes.values() for w in ops
               for t in graph.get_operation_by_name(w).outputs}
    owners = collections.defaultdict(set)  # op name -> the records it computes
    for index, record in enumerate(records):
        for name in record.tensor_names():
            owners[graph.get_tensor_by_name(name).op.name].add(index)
    found = []
    for index, record in enumerate(records):
        ops = {graph.get_tensor_by_name(name).op for name in record.tensor_names()}
        reached = _data_downstream([c for op in ops for out in op.outputs
                                    for c in out.consumers()], stop=written)
        if any(owners.get(name, set()) - {index} for name in reached):
            found.append(record.variable)
    return list(dict.fromkeys(found))


@dataclasses.dataclass(frozen=True)
class GradientSources:
    """The ops each trained variable's gradients come from, their own included (Grappler may
    rename or fold a gradient's own op, and the ops it comes from ran for it), as components of
    the graph: the ops of a loop in it (a tf.compat.v1 while loop) together, each component
    after those it waits for. `components`: (its ops' names, the indices of the components it
    waits for); `heads`: per variable, the components of its gradients' own ops."""
    components: List[Tuple[List[str], List[int]]]
    heads: Dict[str, List[int]]

    def latest(self, values: Dict[str, float]) -> Dict[str, Optional[float]]:
        """Per variable, the largest of `values` (by op name) among its gradients' sources;
        None where none of them has a value."""
        best: List[Optional[float]] = []
        for names, ahead in self.components:
            found = [values[name] for name in names if name in values]
            best.append(max(found + [best[i] for i in ahead if best[i] is not None],
                            default=None))
        return {variable: max((best[i] for i in heads if best[i] is not None), default=None)
                for variable, heads in self.heads.items()}


def gradient_sources(graph: tf.Graph, analysis: GraphAnalysis) -> GradientSources:
    """One walk of the graph upstream of every trained variable's gradients (not one for each
    variable: each would cross the whole forward pass)."""
    heads = {name: _gradient_ops(graph, info) for name, info in analysis.variables.items()}
    component_of, components = _components(set().union(*heads.values()))
    return GradientSources(components, {name: sorted({component_of[op] for op in ops})
                                        for name, ops in heads.items()})


def _components(roots) -> Tuple[Dict[tf.Operation, int], List[Tuple[List[str], List[int]]]]:
    """The ops `roots` wait for, and the roots, in strongly connected components (Tarjan's,
    without recursion: a graph is deeper than Python's stack), each component after those it
    waits for: (the index of each op's component, the components as GradientSources has
    them)."""
    order: Dict[tf.Operation, int] = {}
    low: Dict[tf.Operation, int] = {}
    stack, on_stack, work = [], set(), []  # work: (op, its parents not yet looked at)
    component_of: Dict[tf.Operation, int] = {}
    components: List[Tuple[List[str], List[int]]] = []

    def visit(op):
        order[op] = low[op] = len(order)
        stack.append(op)
        on_stack.add(op)
        work.append((op, iter(parents(op))))

    for root in roots:
        if root in order:
            continue
        visit(root)
        while work:
            op, unvisited = work[-1]
            for parent in unvisited:
                if parent not in order:
                    visit(parent)
                    break
                if parent in on_stack:
                    low[op] = min(low[op], order[parent])
            else:  # every parent done: op's component may be complete
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[op])
                if low[op] == order[op]:
                    members = []
                    while not members or members[-1] is not op:
                        members.append(stack.pop())
                        on_stack.discard(members[-1])
                        component_of[members[-1]] = len(components)
                    ahead = {component_of[p] for m in members for p in parents(m)}
                    components.append(([m.name for m in members],
                                       sorted(ahead - {len(components)})))
    return component_of, components


def _gradient_ops(graph: tf.Graph, info: VariableInfo) -> Set[tf.Operation]:
    return {graph.get_tensor_by_name(tensor).op
            for record in info.gradients for tensor in record.tensor_names()}


def update_ops_by_variable(graph: tf.Graph, analysis: GraphAnalysis) -> Dict[str, Set[str]]:
    """Per trained variable, the names of the ops of its update: those its writes and its
    slots' wait for after its gradient, except those another variable's writes also wait for
    (the global norm of a clipping is every variable's update, and none's alone). A state
    written after every variable's update (Adam's powers of beta) is no variable's."""
    writes = {name: {graph.get_operation_by_name(op) for op in info.update_ops}
              for name, info in analysis.variables.items()}
    writer = {op: name for name, ops in writes.items() for op in ops}
    gradients = set().union(*(_gradient_ops(graph, info) for info in analysis.variables.values()))
    before = gradients | upstream_ops(gradients)
    # What is upstream of an op in `before` is in `before`: the walks from the writes stop
    # there (not through the whole forward pass), unless a write is in `before` itself.
    stop = frozenset() if any(op in before for op in writer) else before
    for state in analysis.extra_state.values():
        for op in map(graph.get_operation_by_name, state.update_ops):
            if state.owner in writes and all(writer.get(ahead, state.owner) == state.owner
                                             for ahead in upstream_ops([op], stop)):
                writes[state.owner].add(op)
    ops = {name: (written | upstream_ops(written, before)) - before
           for name, written in writes.items()}
    owners = collections.Counter(op for own in ops.values() for op in own)
    return {name: {op.name for op in own if owners[op] == 1} for name, own in ops.items()}


# Ops whose outputs differ from worker to worker: its data, and its random numbers.
_PER_WORKER_SOURCES = DATA_SOURCE_OPS | STATEFUL_RANDOM_OP_TYPES
# The writes whose value can be averaged over workers: the value is their second input.
_AVERAGEABLE_WRITES = frozenset({"Assign", "AssignAdd", "AssignSub", "AssignVariableOp",
                                 "AssignAddVariableOp", "AssignSubVariableOp"})


def _training_writes(graph: tf.Graph) -> Dict[str, List[str]]:
    """Every op that writes a variable, by variable, but its initializer and restores from a
    checkpoint: what training (any of the user's train ops) may run."""
    initializers = {initializer_op(v).name for v in
                    graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
                    + graph.get_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES)}
    restored = _data_downstream(
        [op for op in graph.get_operations() if op.type in RESTORE_OP_TYPES], stop=set())
    writes = {}
    for variable, ops in _writes_by_variable(graph).items():
        kept = [w for w in ops if w not in initializers and w != f"{variable}/Assign"
                and w not in restored]
        if kept:
            writes[variable] = kept
    return writes


def _per_worker_ops(graph: tf.Graph, gradient_names: set, settings: bool = True) -> set:
    """Names of ops computed from a worker's own data without passing through a gradient
    (gradients are aggregated, hence the same on every worker); with `settings` False, not
    from settings: a placeholder of one value (a learning rate, a dropout rate), which every
    worker feeds alike, as the same script computes it."""
    sources = [op for op in graph.get_operations() if op.type in _PER_WORKER_SOURCES
               and (settings or not is_setting(op))]
    return _data_downstream(sources, stop=gradient_names)


def _data_downstream(ops, stop: set, values_only: bool = False) -> set:
    """Names of the ops computed from `ops` (not past the tensors named in `stop`); with
    `values_only`, not through ops that read only their inputs' shapes."""
    return {op.name for op in walk(ops, lambda op: [
        c for out in op.outputs if out.name not in stop for c in out.consumers()
        if not (values_only and c.type in SHAPE_ONLY_OPS)])}


def _check_gradients_are_applied(graph, records, writes) -> None:
    """A gradient that reaches no write is computed for monitoring only: aggregating it would
    put a collective into every fetch of it, possibly on one worker alone."""
    written = {graph.get_operation_by_name(w) for ops in writes.values() for w in ops}
    for record in records:
        gradient_ops = [graph.get_tensor_by_name(n).op for n in record.tensor_names()]
        if not downstream_ops(gradient_ops, until=written) & written:
            raise ParallaxError(
                f"the gradient {record.tensor_names()[0]!r} of variable {record.variable!r} "
                "is computed but never applied to any variable: Parallax aggregates gradients "
                "for training only. Fetch or summarize the gradients your optimizer applies "
                "(those returned by compute_gradients) instead of computing them again")


def _check_trained_variables_not_written_from_the_batch(graph, variables, ahead,
                                                       gradient_names) -> None:
    """A write of a trained variable computed from the batch the gradients come from (the rows
    of its ids), not through the aggregated gradients: each worker would write what its share
    of the batch gives, where one device writes what the whole batch gives. Input only the write
    reads (a pretrained table fed to an assign) is every worker's alike."""
    batch = [op for op in ahead if op.type in _PER_WORKER_SOURCES
             and not is_setting(op)]
    from_batch = _data_downstream(batch, stop=gradient_names)
    for name, info in variables.items():
        for write in info.update_ops:
            if write in from_batch:
                raise ParallaxError(
                    f"{write!r} writes the trained variable {name!r} from the batch itself "
                    "(not through its gradients, which Parallax aggregates): each worker would "
                    "write what its share of the batch gives, one device what the combined "
                    "batch gives (the rows of its ids, say). Write it from the variable alone "
                    "(clip the whole table, or embedding_lookup's max_norm) or from the "
                    "gradients")


def _check_not_an_uncaptured_update(graph, name, write_ops) -> None:
    for write in write_ops:
        op = graph.get_operation_by_name(write)
        if op.type.startswith(_FUSED_UPDATE_PREFIXES) and _variable_behind(op.inputs[0]) == name:
            raise ParallaxError(
                f"{op.type} {write!r} trains variable {name!r}, but its gradient was not "
                "recorded: gradients from tf.GradientTape inside a graph are not seen by "
                "Parallax. Compute them with tf.compat.v1.gradients or an optimizer's "
                "minimize / compute_gradients")


def _check_averageable(graph, write, name) -> None:
    op = graph.get_operation_by_name(write)
    if op.type not in _AVERAGEABLE_WRITES:
        shapeless = sorted(p.name for p in upstream_ops([op]) if p.type in PLACEHOLDER_OPS
                           and p.outputs[0].shape.rank is None)
        hint = (f" If {shapeless[0]!r} is a setting every worker feeds alike (a learning "
                "rate), give it its scalar shape: tf.compat.v1.placeholder(tf.float32, [])"
                if shapeless else "")
        raise ParallaxError(
            f"{op.type} {write!r} writes {name!r} from each worker's own data; Parallax keeps "
            "such state identical on every worker by averaging the written value, which only "
            f"assignments (assign, assign_add, assign_sub) allow. Write it with one of them."
            + hint)


def _writes_by_variable(graph: tf.Graph) -> Dict[str, List[str]]:
    writes: Dict[str, List[str]] = collections.defaultdict(list)
    # A dynamic embedding's new rows are written from their ids alone (embeddings/table.py),
    # also where the split wrote them per shard ('<write>/part_<j>').
    first_values = {name for table in read_tables(graph) for name in table.first_values}
    for op in graph.get_operations():
        if whole_name(op.name) in first_values:
            continue
        if op.type.startswith(_FUSED_UPDATE_PREFIXES):
            written = op.inputs
        elif op.type.startswith(_ASSIGN_PREFIXES) and op.inputs:
            written = op.inputs[:1]
        elif op.type in FUNCTION_CALL_OPS and _function_writes(graph, op.node_def):
            # An update inside tf.cond's branch: the cond writes what it is handed.
            written = [t for t in op.inputs if t.dtype == tf.resource]
        else:
            continue
        for source in {_variable_behind(t) for t in written} - {None}:
            writes[source].append(op.name)
    return writes


def _function_writes(graph: tf.Graph, node_def) -> bool:
    """Whether the functions a node calls (and those they call) write a variable."""
    for attr in node_def.attr.values():
        names = [attr.func.name] if attr.HasField("func") else [f.name for f in attr.list.func]
        for name in names:
            function = tf_private.get_function(graph, name)
            if function is None:
                continue
            for node in function.definition.node_def:
                if node.op.startswith(_FUSED_UPDATE_PREFIXES + _ASSIGN_PREFIXES) or (
                        node.op in FUNCTION_CALL_OPS and _function_writes(graph, node)):
                    return True
    return False


_PASSING_HANDLES = frozenset({"Identity", "RefIdentity", "Switch", "RefSwitch", "Enter",
                              "RefEnter"})


def _variable_behind(tensor: tf.Tensor) -> Optional[str]:
    """The variable op a handle or ref tensor comes from, looking through Identity and into
    v1 control flow (a tf.cond's Switch, a loop's Enter: TF1 behaviour)."""
    op = tensor.op
    while op.type in _PASSING_HANDLES and op.inputs:
        op = op.inputs[0].op
    return op.name if op.type in VARIABLE_OP_TYPES else None


def _variables_read(graph: tf.Graph, op_names: List[str], stop: set) -> set:
    """Variables whose handles or refs feed `op_names`, not looking past the gradients (beyond
    them lies the whole forward pass)."""
    def inputs(op):
        return [] if op.type in VARIABLE_OP_TYPES else [t.op for t in op.inputs
                                                        if t.op not in stop]

    start = [graph.get_operation_by_name(name) for name in op_names]
    return {op.name for op in walk([op for op in start if op not in stop], inputs)
            if op.type in VARIABLE_OP_TYPES}


def _colocated_variable(graph: tf.Graph, name: str, variables) -> Optional[str]:
    for group in graph.get_operation_by_name(name).colocation_groups():
        target = group.decode()[len("loc:@"):]
        if target in variables:
            return target
    return None
