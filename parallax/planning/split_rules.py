"""The rules of splitting a variable in row shards (split_variables.py): which ops of a graph
use the variable, its slots or its gradient, and how each is computed per shard. Reading only:
`classify` returns what to do with each op, or raises NotSplittable saying why the variable
cannot be split.

A tensor computed per shard has a kind (Kind, below); an op reading such tensors is, by its
type and the kinds it reads: computed once per shard (`clone`: elementwise ops that broadcast
over the rows, tf.unique, the sum of the rows of one id, an optimizer's update, a read, a
write), a sum over every shard (`reduce`: L2Loss, Sum over the rows), a lookup that reads each
id's row from its shard (`gather`), a constant (`shape`), or, for any other use of a
variable's rows, the rows stitched whole (`stitch_inputs`). An op reading a gradient's rows or
ids in any other way may depend on their order: the variable is not split.
"""
from __future__ import annotations

import dataclasses
import heapq
from typing import Dict, List, Optional, Tuple

import tensorflow as tf

from parallax import contracts, tf_private
from parallax.planning.problem import shard_name
from parallax.vocabulary import FUNCTION_CALL_OPS, initializer_op, slots_of

# Elementwise ops: computed per shard when every operand not split broadcasts over the rows.
_ELEMENTWISE = frozenset({
    "Add", "AddV2", "AddN", "Sub", "Mul", "MulNoNan", "Div", "RealDiv", "DivNoNan", "FloorDiv",
    "FloorMod", "Maximum", "Minimum", "Pow", "SquaredDifference", "Neg", "Abs", "Sign",
    "Square", "Sqrt", "Rsqrt", "Reciprocal", "Exp", "Log", "Log1p", "Expm1", "Tanh", "Sigmoid",
    "Relu", "Floor", "Ceil", "Round", "ZerosLike", "OnesLike", "ClipByValue", "SelectV2",
    "Greater", "GreaterEqual", "Less", "LessEqual", "Equal", "NotEqual", "LogicalAnd",
    "LogicalOr", "LogicalNot", "IsFinite", "IsNan"})
_PASS_THROUGH = frozenset({"Identity", "StopGradient", "Snapshot", "Cast"})  # any kind
_WRITES = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"})
_SCATTERS = frozenset({"ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterMul",
                       "ResourceScatterDiv", "ResourceScatterMin", "ResourceScatterMax",
                       "ResourceScatterUpdate"})
_PEELED = ("Cast", "Identity")  # looked through when reading a shape


class NotSplittable(Exception):
    """Why a variable cannot be split (the message); the cost model then keeps it whole."""


@dataclasses.dataclass
class Family:
    """A variable split in `shards`, and its slots: every member has `rows` rows."""

    variable: str
    members: List[str]
    shards: int
    rows: int
    initializers: Dict[str, str]  # a member's initializer op -> the member

    def shard(self, member: str, j: int) -> str:
        return shard_name(member, j)

    def rows_of(self, j: int) -> tf.Tensor:
        return tf.range(j, self.rows, self.shards)

    def rows_in(self, j: int) -> int:
        return len(range(j, self.rows, self.shards))


# A tensor computed per shard has a kind, whose second item is its family's variable:
# ('aligned', F) holds rows of F in shard order; ('ids', F, key) local row ids, and
# ('rows', F, key) rows that follow those ids (a gradient's values); ('pos', F, key, unique)
# says where each id of `key` is among the ids `unique` (tf.unique's second output);
# ('meta', F, ...) is the shape of a tensor of the kind that follows. ('handle', member) marks
# a member's handle.
Kind = Tuple[str, ...]


def families_of(graph: tf.Graph, splits: Dict[str, int]) -> Dict[str, Family]:
    """Each variable to split, with its slots: the variables colocated with it with as many
    rows. Only resource variables whose gradients are all sparse are split."""
    variables = {v.op.name: v for v in graph.get_collection(
        tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
    records = contracts.read_gradients(graph)
    families = {}
    for name, shards in splits.items():
        if name not in variables:
            raise NotSplittable(f"{name!r} is not a global variable")
        if variables[name].op.type != "VarHandleOp":
            raise NotSplittable(f"{name!r} is a reference variable; only resource variables "
                                "are split")
        own = [r for r in records if r.variable == name]
        if not own:
            raise NotSplittable(f"{name!r} has no gradient in this graph")
        if not all(r.is_sparse for r in own):
            raise NotSplittable(f"{name!r} has a dense gradient")
        rows = tf.compat.dimension_value(variables[name].shape[0])
        slots = [v.op.name for v in slots_of(graph, name) if v.op.type == "VarHandleOp"]
        dense = [r.variable for r in records if r.variable in slots and not r.is_sparse]
        if dense:
            raise NotSplittable(f"{dense[0]!r}, colocated with {name!r} with as many rows, "
                                "has a dense gradient")
        members = [name] + slots
        family = Family(name, members, shards, rows,
                        {initializer_op(variables[m]).name: m for m in members})
        families.update({member: family for member in family.members})
    return families


def sources_of(graph, families, with_gradients) -> Dict[tf.Tensor, Kind]:
    """Where the rules start: the members' handles, and the split variables' gradients."""
    sources = {graph.get_operation_by_name(m).outputs[0]: ("handle", m) for m in families}
    if with_gradients:
        for record in contracts.read_gradients(graph):
            if record.variable in families:
                key = (families[record.variable].variable, record.indices)
                sources[graph.get_tensor_by_name(record.values)] = ("rows",) + key
                sources[graph.get_tensor_by_name(record.indices)] = ("ids",) + key
    return sources


@dataclasses.dataclass
class Step:
    """What the rewrite does with an op that reads split tensors or handles: `how` is clone,
    reduce, gather, shape, initialized, stitch_inputs or drop (what split_variables builds for
    each); a clone's outputs have `outputs` kinds (None: not split)."""

    op: tf.Operation
    how: str
    outputs: Tuple[Optional[Kind], ...] = ()
    slice_inputs: Tuple[int, ...] = ()  # whole inputs of which each shard takes its rows
    row_count_inputs: Tuple[int, ...] = ()  # the family's number of rows: the shard's
    partition_inputs: Tuple[int, ...] = ()  # (ids, updates) each shard takes its ids of


def classify(families, sources: Dict[tf.Tensor, Kind]) -> List[Step]:
    """The rewrite's steps, each op after those it reads; NotSplittable for an op the rules do
    not cover. Ops are taken in the order they were built, which puts every op after its
    inputs, and only those reading a split tensor are visited."""
    kinds = dict(sources)
    steps, pending, queued = [], [], set()

    def queue(tensor):
        for consumer in tensor.consumers():
            if consumer not in queued:
                queued.add(consumer)
                heapq.heappush(pending, (tf_private.creation_index(consumer), consumer))

    for tensor in sources:
        queue(tensor)
    while pending:
        _, op = heapq.heappop(pending)
        split = {i: kinds[t] for i, t in enumerate(op.inputs) if t in kinds}
        if tf_private.control_flow_context(op) is not None:
            raise NotSplittable(f"{op.name!r} uses it inside a tf.compat.v1 control-flow "
                                "context (cond, while_loop)")
        step = _rule(op, split, families)
        steps.append(step)
        for out, kind in zip(op.outputs, step.outputs):
            if kind:
                kinds[out] = kind
                queue(out)
    return steps


def _rule(op, split: Dict[int, Kind], families) -> Step:
    """How `op` is rewritten, given the kinds of its split inputs (by index)."""
    if any(kind[0] == "handle" for kind in split.values()):
        return _handle_rule(op, split, families)
    kinds = set(split.values())
    family = families[next(iter(kinds))[1]]
    (kind,) = kinds if len(kinds) == 1 else (None,)
    if op.type in _PASS_THROUGH and kind is not None:
        return Step(op, "clone", (kind,))
    if op.type == "GatherV2" and split.get(0, ("",))[0] == "aligned":
        return _gather_rule(op, split, split[0])
    if kind is not None and kind[0] in ("aligned", "rows"):
        if op.type in _ELEMENTWISE and _broadcasts_over_rows(op, split):
            return Step(op, "clone", (kind,))
        if op.type == "L2Loss" or (op.type == "Sum" and _sums_rows(op)):
            return Step(op, "reduce")
    if op.type == "Shape" and kind is not None and kind[0] != "aligned":
        return Step(op, "clone", (("meta", kind[1]) + kind,))
    if op.type == "Shape" and kind is not None:
        if not op.inputs[0].shape.is_fully_defined():
            raise NotSplittable(f"{op.name!r} takes the shape of rows of unknown shape")
        return Step(op, "shape")  # the whole rows' shape: a constant
    if op.type == "StridedSlice" and kind is not None and kind[0] == "meta" and set(split) == {0}:
        return Step(op, "clone", (kind,))
    if op.type == "Unique" and kind is not None and kind[0] == "ids":
        unique = ("ids", kind[1], op.outputs[0].name)
        return Step(op, "clone", (unique, ("pos",) + kind[1:] + (op.outputs[0].name,)))
    if op.type == "UnsortedSegmentSum":
        return _segment_sum_rule(op, split, family)
    if all(k[0] == "aligned" for k in kinds):
        return Step(op, "stitch_inputs")  # any other use of the rows reads them whole
    raise NotSplittable(
        f"{op.type} {op.name!r} reads {_described(split)} of {family.variable!r}, which "
        "Parallax does not know how to compute per shard")


def _handle_rule(op, split, families) -> Step:
    members = {families[k[1]].variable for k in split.values() if k[0] == "handle"}
    family = families[members.pop()]
    if members:
        raise NotSplittable(f"{op.name!r} uses two split variables at once")
    if initialized_value_of(op.outputs[0] if op.outputs else None, families) and all(
            c.name in family.initializers for c in _consumers_through_identity(op)):
        return Step(op, "drop")  # a slot's initial value: the shards have their own
    if op.type in ("ReadVariableOp", "DisableCopyOnRead"):
        return Step(op, "clone", (("aligned", family.variable),) * len(op.outputs))
    if op.type == "VariableShape":
        return Step(op, "shape")
    if op.type == "VarIsInitializedOp":
        return Step(op, "initialized")
    if op.type == "ResourceGather":
        return _gather_rule(op, split, ("aligned", family.variable))
    if op.type in _WRITES and 1 not in split:
        return Step(op, "clone", slice_inputs=(1,))
    if op.type in _WRITES and split[1] == ("aligned", family.variable):
        return Step(op, "clone")
    if op.type in _SCATTERS:
        ids, updates = split.get(1), split.get(2)
        if ids is None and updates is None and op.inputs[1].shape.rank == 1 and \
                (op.inputs[2].shape.rank or 0) >= 1:  # rows that follow the ids
            return Step(op, "clone", partition_inputs=(1, 2))
        if ids is not None and ids[:2] == ("ids", family.variable) and \
                updates == ("rows",) + ids[1:]:
            return Step(op, "clone")
    if op.type.startswith(("ResourceSparseApply", "ResourceApply")):
        return _apply_rule(op, split, family)
    taking_it = (" (a function taking it: tf.while_loop, tf.cond)"
                 if op.type in FUNCTION_CALL_OPS else "")
    raise NotSplittable(f"{op.type} {op.name!r} uses {family.variable!r} (or its slot) in a "
                        f"way Parallax does not rewrite per shard{taking_it}")


def initialized_value_of(tensor: Optional[tf.Tensor], families) -> Optional[str]:
    """The member whose `initialized_value()` `tensor` is (its value if initialized, else its
    initial value: tf.cond on VarIsInitializedOp), which a slot or moving average starts from;
    else None."""
    if tensor is None:
        return None
    tensor = _peeled(tensor)
    op = tensor.op
    if op.type not in ("If", "StatelessIf") or op.inputs[0].op.type != "VarIsInitializedOp":
        return None
    handle = op.inputs[0].op.inputs[0]
    if handle.op.name in families and handle in list(op.inputs[1:]):
        return handle.op.name
    return None


def _consumers_through_identity(op) -> List[tf.Operation]:
    found, stack = [], [c for out in op.outputs for c in out.consumers()]
    while stack:
        consumer = stack.pop()
        if consumer.type == "Identity":
            stack.extend(consumer.outputs[0].consumers())
        else:
            found.append(consumer)
    return found


def _apply_rule(op, split, family) -> Step:
    """An optimizer's update of the variable and its slots: each shard with its own slots and
    rows; the learning rate and other scalars shared."""
    names = [arg.name for arg in op.op_def.input_arg]
    sparse = op.type.startswith("ResourceSparseApply")
    sliced = []
    for i, tensor in enumerate(op.inputs):
        kind = split.get(i)
        if tensor.dtype == tf.resource:
            ok = kind is not None and kind[0] == "handle"
        elif kind is None and not sparse and tensor.shape.rank and \
                tensor.shape[0] == family.rows:
            ok = True  # a whole gradient (an accumulated one): each shard its rows
            sliced.append(i)
        elif kind is None:
            ok = tensor.shape.rank == 0
        elif sparse and names[i] == "indices":  # this variable's ids, not another's
            ok = kind[:2] == ("ids", family.variable)
        elif sparse and names[i] == "grad":
            ok = kind[:2] == ("rows", family.variable) and \
                split.get(names.index("indices"), ())[1:] == kind[1:]
        else:
            ok = kind == ("aligned", family.variable)
        if not ok:
            raise NotSplittable(f"{op.type} {op.name!r} updates {family.variable!r} with "
                                f"{names[i]!r}, which is not per shard or shared")
    return Step(op, "clone", slice_inputs=tuple(sliced))


def _gather_rule(op, split, kind) -> Step:
    """A lookup of whole ids reads from every shard; of a split gradient's ids, from its own."""
    if op.get_attr("batch_dims") != 0 or (
            op.type == "GatherV2" and tf.get_static_value(op.inputs[2]) != 0):
        raise NotSplittable(f"{op.type} {op.name!r} gathers along another axis than the rows")
    ids = split.get(1)
    if ids is None:
        return Step(op, "gather")
    if ids[0] == "ids" and ids[1] == kind[1]:
        return Step(op, "clone", (("rows",) + ids[1:],))
    raise NotSplittable(f"{op.type} {op.name!r} gathers split rows with ids of another tensor")


def _segment_sum_rule(op, split, family) -> Step:
    """Rows of one id summed (an optimizer's deduplication, by tf.unique's positions), or a
    gradient made dense (by its ids, into the variable's rows)."""
    data, segments, count = split.get(0), split.get(1), split.get(2)
    if data is not None and data[0] == "rows" and segments is not None:
        if (segments[0] == "pos" and segments[1:3] == data[1:]
                and count == ("meta", data[1], "ids", data[1], segments[3])):
            return Step(op, "clone", (("rows", data[1], segments[3]),))
        if segments == ("ids",) + data[1:] and count is None and \
                _counts_rows(op.inputs[2], family):
            return Step(op, "clone", (("aligned", data[1]),), row_count_inputs=(2,))
    raise NotSplittable(f"UnsortedSegmentSum {op.name!r} sums rows of {family.variable!r} in "
                        "a way Parallax does not compute per shard")


def _counts_rows(tensor: tf.Tensor, family: Family) -> bool:
    """Whether `tensor` is the first dimension of a shape with the family's rows (a gradient's
    dense_shape[0]): per shard, the shard's rows."""
    tensor = _peeled(tensor)
    constant = tf.get_static_value(tensor)
    if constant is not None:
        return constant.tolist() == family.rows
    if tensor.op.type != "StridedSlice" or tensor.op.get_attr("shrink_axis_mask") != 1:
        return False
    begin, end = (tf.get_static_value(t) for t in tensor.op.inputs[1:3])
    source = _peeled(tensor.op.inputs[0])
    if source.op.type == "VariableShape":
        rows = tf.TensorShape(source.op.inputs[0].op.get_attr("shape")).as_list()[0]
    elif source.op.type == "Shape":
        rows = tf.compat.dimension_value(source.op.inputs[0].shape[0])
    else:  # a constant shape
        shape = tf.get_static_value(source)
        rows = shape.tolist()[0] if shape is not None and shape.size else None
    return (begin is not None and end is not None and begin.tolist() == [0]
            and end.tolist() == [1] and rows == family.rows)


def _peeled(tensor: tf.Tensor) -> tf.Tensor:
    while tensor.op.type in _PEELED:
        tensor = tensor.op.inputs[0]
    return tensor


def _broadcasts_over_rows(op, split) -> bool:
    """Whether every operand not split has a lower rank than the split ones (broadcasting
    then never spans their rows)."""
    rank = min(op.inputs[i].shape.rank or 0 for i in split)
    return rank > 0 and all(t.shape.rank is not None and t.shape.rank < rank
                            for i, t in enumerate(op.inputs) if i not in split)


def _sums_rows(op) -> bool:
    axes = tf.get_static_value(op.inputs[1])
    rank = op.inputs[0].shape.rank
    return axes is not None and rank is not None and 0 in [a % rank for a in
                                                           axes.reshape(-1).tolist()]


def _described(split) -> str:
    what = {"aligned": "the rows", "rows": "the gradient's rows", "ids": "the ids",
            "pos": "the positions of ids", "meta": "the shape of a tensor split in shards"}
    return ", ".join(sorted({what[k[0]] for k in split.values()}))


def splittable(graph: tf.Graph, variables: List[str]) -> Optional[str]:
    """None when `variables` can be split in row shards together, else why not."""
    try:
        steps_of(graph, families_of(graph, {name: 2 for name in variables}), True)
    except NotSplittable as why:
        return str(why)
    return None


def splittable_in_turn(graph: tf.Graph, variables: List[str]
                       ) -> Tuple[List[str], Dict[str, str]]:
    """Of `variables`, those split together, taken in turn, each kept where it splits with those
    kept before it (two tables may split alone and not together: b.assign(a)); and why each
    other one stays whole. The driver and a later graph split alike by it."""
    kept, whole = [], {}
    for name in variables:
        why = splittable(graph, [*kept, name])
        if why is None:
            kept.append(name)
        else:
            whole[name] = why
    return kept, whole


def steps_of(graph, families, with_gradients) -> List[Step]:
    return classify(families, sources_of(graph, families,
                                                                 with_gradients))
