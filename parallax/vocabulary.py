"""The graph's vocabulary, for every stage: the kinds of ops Parallax tells apart (variables,
input, random draws, restores, function calls), the walks over a graph's ops, and the start of
a graph's queue runners. A list of op types is written here once; the stages import it."""
from __future__ import annotations

import threading
from typing import Callable, Collection, Hashable, Iterable, Iterator, List, Set, TypeVar

import tensorflow as tf

from parallax import tf_private
from parallax.errors import ParallaxError

# -- op kinds -------------------------------------------------------------------------------
VARIABLE_OP_TYPES = frozenset({"VarHandleOp", "VariableV2", "Variable"})
# Ops that run a function (tf.cond's branches, a while loop's body) on the handles they take.
FUNCTION_CALL_OPS = frozenset({"While", "StatelessWhile", "If", "StatelessIf", "Case",
                               "StatelessCase", "PartitionedCall", "StatefulPartitionedCall"})
CONDITIONAL_OPS = frozenset({"If", "StatelessIf"})
# Where a step's examples enter the graph: a tf.data iterator's next element, a queue's
# dequeue (shuffle_batch, batch).
ITERATOR_GET_NEXT_OPS = frozenset({"IteratorGetNext", "IteratorGetNextSync"})
QUEUE_DEQUEUE_OPS = frozenset({
    "QueueDequeue", "QueueDequeueV2", "QueueDequeueMany", "QueueDequeueManyV2",
    "QueueDequeueUpTo", "QueueDequeueUpToV2"})
INPUT_OP_TYPES = ITERATOR_GET_NEXT_OPS | QUEUE_DEQUEUE_OPS
ENQUEUE_OP_TYPES = frozenset({"QueueEnqueue", "QueueEnqueueV2", "QueueEnqueueMany",
                              "QueueEnqueueManyV2"})
# A reader's records, which a queue-based pipeline batches before its dequeue.
READER_READ_OPS = frozenset({"ReaderRead", "ReaderReadV2", "ReaderReadUpTo",
                             "ReaderReadUpToV2"})
PLACEHOLDER_OPS = frozenset({"Placeholder", "PlaceholderV2", "PlaceholderWithDefault"})
# What differs from worker to worker as data: fed, read or dequeued.
DATA_SOURCE_OPS = PLACEHOLDER_OPS | INPUT_OP_TYPES | READER_READ_OPS
ITERATOR_OPS = frozenset({"OneShotIterator", "IteratorV2", "Iterator"})
RESTORE_OP_TYPES = frozenset({"RestoreV2", "Restore", "RestoreSlice"})
# Random ops that draw from a state of their own, which each session starts anew.
STATEFUL_RANDOM_OP_TYPES = frozenset({
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "ParameterizedTruncatedNormal", "RandomGamma", "RandomPoisson", "RandomPoissonV2",
    "RandomShuffle", "Multinomial", "RandomCrop"})
# Ops whose outputs depend on their inputs' shapes alone, not on the values.
SHAPE_ONLY_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank", "OnesLike", "ZerosLike"})
# A scalar division, as a loss divided by a count is.
DIVIDING_OPS = frozenset({"RealDiv", "Div", "DivNoNan"})


def is_setting(op: tf.Operation) -> bool:
    """A placeholder of one value: a learning rate, a dropout rate, is_training."""
    return op.type in PLACEHOLDER_OPS and op.outputs[0].shape.rank == 0


# -- variables ------------------------------------------------------------------------------
# What a variable's initializer is: the write of its whole value, the value its second input.
INITIALIZER_OP_TYPES = frozenset({"Assign", "AssignVariableOp"})


def initializer_op(variable) -> tf.Operation:
    """A variable's initializer as an op: tf.compat.v1.train.init_from_checkpoint makes a
    reference variable's a tensor (its Assign's output)."""
    initializer = variable.initializer
    return getattr(initializer, "op", initializer)


def load_values(session, variables, values) -> None:
    """Each of `variables` takes its value of `values`, in one run of `session`: through its
    initializer, its value fed, however the initializer was built (an initializer, a tensor,
    a checkpoint's restore). Variable.load does the same, a variable a run."""
    initializers = [initializer_op(variable) for variable in variables]
    for variable, op in zip(variables, initializers):
        if op.type not in INITIALIZER_OP_TYPES:
            raise ParallaxError(f"{variable.op.name!r} is initialized by {op.name!r}, a "
                                f"{op.type}, not a write of its value that Parallax can feed")
    session.run(initializers, {op.inputs[1]: value for op, value in zip(initializers, values)})


def slots_of(graph: tf.Graph, name: str) -> List[tf.Variable]:
    """The global variables TensorFlow colocated with variable `name` that have as many rows:
    its optimizer slots (slot_creator colocates a slot with its primary)."""
    variables = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    primary = [v for v in variables if v.op.name == name]
    if not primary or not primary[0].shape.rank:
        return []
    group = f"loc:@{name}".encode()
    return [v for v in variables if v.op.name != name and group in v.op.colocation_groups()
            and v.shape.rank and v.shape[0] == primary[0].shape[0]]


# -- walks ----------------------------------------------------------------------------------
Node = TypeVar("Node", bound=Hashable)


def walk(start: Iterable[Node], successors: Callable[[Node], Iterable[Node]]) -> Iterator[Node]:
    """Each of `start` and all that `successors` leads to from it, once each, depth first: the
    walk the others here are, for walks of their own (what a node leads to is the caller's:
    parents, consumers, or none past where it stops)."""
    seen, stack = set(), list(start)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        yield node
        stack.extend(successors(node))


def data_consumers(op: tf.Operation) -> List[tf.Operation]:
    """The ops that take an output of `op` as an input."""
    return [consumer for out in op.outputs for consumer in out.consumers()]


def computed_from(first: Iterable[tf.Operation], stop: Collection[tf.Operation] = ()
                  ) -> Iterator[tf.Operation]:
    """`first` and the ops computed from them by data, never entering those in `stop`."""
    return walk([op for op in first if op not in stop],
                lambda op: [c for c in data_consumers(op) if c not in stop])


def parents(op: tf.Operation) -> List[tf.Operation]:
    """The ops `op` waits for, by data or control."""
    return [t.op for t in op.inputs] + list(op.control_inputs)


def consumers(op: tf.Operation) -> List[tf.Operation]:
    """The ops that wait for `op`, by data or control."""
    return [c for t in op.outputs for c in t.consumers()] + tf_private.control_outputs(op)


def upstream_ops(ops, stop=frozenset()) -> set:
    """Every op the ops wait for, by data or control, not looking at or past those in
    `stop`."""
    ahead, stack = set(), list(ops)
    while stack:
        op = stack.pop()
        for parent in parents(op):
            if parent not in ahead and parent not in stop:
                ahead.add(parent)
                stack.append(parent)
    return ahead


def downstream_ops(ops, inside=None, until=frozenset()) -> set:
    """Every op that waits for one of `ops`, by data or control: the twin of upstream_ops (an op
    of `ops` is in it only where it waits for another). With `inside`, the walk stays inside
    those ops; with `until`, it stops at the first op of those that it reaches."""
    after, stack = set(), list(ops)
    while stack:
        for consumer in consumers(stack.pop()):
            if consumer in after or (inside is not None and consumer not in inside):
                continue
            after.add(consumer)
            if consumer in until:
                return after
            stack.append(consumer)
    return after


def reached(ops: Iterable[tf.Operation], fed: Collection[tf.Tensor]) -> Set[tf.Operation]:
    """The ops a run of `ops` runs: they and what they wait for, not looking behind the fed
    tensors."""
    return set(walk(ops, lambda op: [t.op for t in op.inputs if t not in fed]
                     + list(op.control_inputs)))


# -- queue runners --------------------------------------------------------------------------

def start_queue_runners(graph: tf.Graph, session, coordinator: tf.compat.v1.train.Coordinator
                        ) -> List[threading.Thread]:
    """The threads of the graph's queue runners (a queue-based input pipeline:
    shuffle_batch, string_input_producer), started in `session` as under
    tf.compat.v1.train.MonitoredSession; the caller stops them through `coordinator`. None
    where the graph has none, where TensorFlow would warn."""
    if not graph.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS):
        return []
    with graph.as_default():
        return tf.compat.v1.train.start_queue_runners(session, coord=coordinator, daemon=True)
