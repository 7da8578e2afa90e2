"""Splitting a variable the user did not partition into row shards, one per server, inside the
worker's copy of the graph: a partitioned variable, as the user could have built with a
partitioner and partition_strategy='mod', for a table the cost model (planning/cost.py)
predicts faster split.

Row r of a variable split in k lives in shard r % k, at row r // k (TensorFlow's 'mod'
strategy): the frequent ids of a vocabulary, its first rows, spread over the shards. The
variable and its optimizer slots (its family: variables colocated with it, with as many rows)
become k variables each, named '<name>/part_<j>', with the rows of the member's initial value.
The ops that use them are rewritten by the rules of split_rules.py:

- a lookup (ResourceGather, or GatherV2 of a read) partitions its ids, gathers from each shard
  and stitches the rows back in order: the same tensor;
- the variable's gradient (IndexedSlices) is partitioned by id, and what the model does with
  it up to the updates is done per shard: scaling, clipping, summing the rows of one id, the
  optimizer's sparse (or dense) update of the shard and its slots; a sum over the rows (an
  L2Loss in a global norm) is the sum of the shards' sums;
- any other use of the value (a Saver's save, a matmul) reads the whole variable, stitched
  from its shards, and a write of a whole value (a restore) writes each shard its rows: a
  checkpoint keeps the single-device names and shapes.

Replaced ops stay in the graph, cut from the variables, and never run; `replacement` gives what
stands for one (for fetches, and for ops the user builds after get_runner, which
`rewrite_uses` rewrites like the others).

It runs on a worker's copy of the graph before the copy is analyzed: the analysis, the plan and
the passes then see shard variables with gradients, updates and slots of their own, as if the
user had partitioned them (parallax.get_partitioner).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

import tensorflow as tf

from parallax import contracts, tf_private
from parallax.contracts import GradientRecord
from parallax.errors import ParallaxError
from parallax.graph_copy import copy_graph
from parallax.planning import split_rules
from parallax.planning.analysis import GraphAnalysis, analyze
from parallax.planning.split_rules import Family, Kind
from parallax.rewriting.rewire import reroute
from parallax.vocabulary import initializer_op


@dataclasses.dataclass
class _State:
    """What a graph's split did, for later rewrites and for fetches (kept in the graph:
    contracts.record_split_state)."""

    families: Dict[str, Family]  # by member
    parts: Dict[str, Tuple[Kind, List[str]]] = dataclasses.field(default_factory=dict)
    whole: Dict[str, str] = dataclasses.field(default_factory=dict)  # replaced -> stand-in
    op_parts: Dict[str, List[str]] = dataclasses.field(default_factory=dict)  # op -> clones
    # a member's initializer -> its shards' initializers
    initializers: Dict[str, List[str]] = dataclasses.field(default_factory=dict)


def copy_and_split(graph: tf.Graph, analysis: GraphAnalysis, splits: Dict[str, int],
                   planned: bool = True) -> Tuple[tf.Graph, GraphAnalysis]:
    """A copy of `graph` to transform, with the variables of the plan's `splits` (name ->
    shards) in row shards, and its analysis (`analysis`, when it splits none). A graph the driver
    did not plan (`planned` False: built after the script's first get_runner, an evaluation
    graph) splits those it can in turn, as the driver chose them
    (split_rules.splittable_in_turn), and keeps the others whole."""
    copy = copy_graph(graph)
    if not planned:
        splits = {name: splits[name]
                  for name in split_rules.splittable_in_turn(copy, list(splits))[0]}
    if not splits:
        return copy, analysis
    copy = split_variables(copy, splits)
    return copy, analyze(copy)


def split_variables(graph: tf.Graph, splits: Dict[str, int]) -> tf.Graph:
    """`graph` with each variable of `splits` (name -> shards, more than 1) and its slots in
    row shards."""
    if not splits:
        return graph
    try:
        state = _State(split_rules.families_of(graph, splits))
        steps = split_rules.steps_of(graph, state.families, with_gradients=True)
    except split_rules.NotSplittable as why:
        raise ParallaxError(
            f"the driver split {', '.join(sorted(splits))} in row shards, which this process's "
            f"graph cannot be: {why}. The script must build the same graph in every "
            "process") from None
    contracts.record_split_state(graph, state)
    with graph.as_default():
        _make_shards(graph, state)
        _split_gradients(graph, state)
        _apply(graph, state, steps)
    return graph


def rewrite_uses(graph: tf.Graph) -> None:
    """Rewrite the ops built since the split that use a split variable (a Saver, a read)."""
    state = contracts.read_split_state(graph)
    if state is not None:
        steps = split_rules.steps_of(graph, state.families, with_gradients=False)
        with graph.as_default():
            _apply(graph, state, steps)


def replacement(graph: tf.Graph, name: str, aggregated: Optional[Dict[str, str]] = None):
    """What stands for the replaced tensor or op `name` of `graph`, or None if it was not
    replaced: a tensor computed per shard is stitched whole, an op groups its clones.
    `aggregated` (contracts.read_aggregated), for a fetch: a gradient's rows or ids are stitched
    from each shard's aggregate, as the whole gradient's fetch gives its aggregate."""
    state = contracts.read_split_state(graph)
    if state is None:
        return None
    # A gradient's rows stitched from the aggregates are kept apart from every other stand-in.
    aggregated_key = f"{name} aggregated"
    for key in ([aggregated_key] if aggregated is not None else []) + [name]:
        if key in state.whole:
            return graph.as_graph_element(state.whole[key])
    cached = name
    with graph.as_default(), tf.name_scope("parallax_split"):
        if name in state.op_parts:
            group = tf.group(*[graph.get_operation_by_name(n) for n in state.op_parts[name]])
        elif name in state.initializers:
            group = tf.group(*[graph.get_operation_by_name(n) for n in state.initializers[name]])
        elif name in state.parts:
            kind, parts = state.parts[name]
            family = state.families[kind[1]]
            if kind[0] == "aligned":
                group = _stitch(family, [graph.get_tensor_by_name(p) for p in parts])
            elif kind[0] in ("rows", "ids") and aggregated is not None:
                group = _stitch_gradient(graph, family, kind[0], parts, aggregated)
                cached = aggregated_key
            else:
                raise ParallaxError(
                    f"{name!r} is computed per shard of {family.variable!r}, which Parallax "
                    f"split in {family.shards} row shards over the servers (a gradient's rows "
                    "or their ids): it can be fetched, but not fed nor used by ops built "
                    "after get_runner. Build such ops before get_runner, or convert the "
                    "gradient to a dense tensor (tf.convert_to_tensor)")
        else:
            return None
    state.whole[cached] = group.name
    return group


def _stitch_gradient(graph, family: Family, kind: str, parts: List[str],
                     aggregated: Dict[str, str]) -> tf.Tensor:
    """A sparse gradient's rows (or ids) from its shards' parts, each its aggregate where it
    has one, in shard order: shard j's local id i is row i * k + j of the whole variable."""
    tensors = [graph.get_tensor_by_name(aggregated.get(p, p)) for p in parts]
    with tf.device(graph.get_tensor_by_name(parts[0]).op.device):  # the worker's
        if kind == "ids":
            tensors = [t * tf.cast(family.shards, t.dtype) + tf.cast(j, t.dtype)
                       for j, t in enumerate(tensors)]
        return tf.concat(tensors, axis=0, name=f"{family.variable}_{kind}")


def split_families(graph: tf.Graph) -> List[Family]:
    """The families `graph` split."""
    state = contracts.read_split_state(graph)
    return list({f.variable: f for f in state.families.values()}.values()) if state else []


def whole_reads(graph: tf.Graph) -> Dict[str, tf.Tensor]:
    """Each member of a split family, by name: its value stitched from its shards (a Saver
    saves it under the single-device name and shape; rewrite_uses makes its restore write the
    shards)."""
    reads = {}
    with graph.as_default(), tf.name_scope("parallax_split"):
        for family in split_families(graph):
            for member in family.members:
                handle = graph.get_operation_by_name(member).outputs[0]
                reads[member] = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.as_dtype(
                    handle.op.get_attr("dtype")))
    return reads


def _make_shards(graph, state: _State) -> None:
    """The shard variables, in place of each member in every collection it was in: each with
    its rows of the member's initial value, a slot's colocated with its variable's shard."""
    variables = {v.op.name: v for v in graph.get_collection(
        tf.compat.v1.GraphKeys.GLOBAL_VARIABLES) if v.op.name in state.families}
    for family in {f.variable: f for f in state.families.values()}.values():
        primaries = []
        for member in family.members:
            variable = variables[member]
            initial = _initial_value(graph, variables, member, state.families)
            shards = []
            for j in range(family.shards):
                # Graph.colocate_with: tf.compat.v1.colocate_with logs a deprecation warning
                colocation = graph.colocate_with(primaries[j] if primaries else None,
                                                 ignore_existing=not primaries)
                with tf.device(variable.op.device), colocation:
                    shards.append(tf.compat.v1.Variable(
                        tf.gather(initial, family.rows_of(j)), name=family.shard(member, j),
                        trainable=False, collections=[], use_resource=True,
                        dtype=variable.dtype.base_dtype))
            primaries = primaries or shards
            state.initializers[initializer_op(variable).name] = [s.initializer.name
                                                                 for s in shards]
            for key in graph.get_all_collection_keys():
                listed = graph.get_collection_ref(key)
                if any(item is variable for item in listed):
                    listed[:] = [new for item in listed
                                 for new in (shards if item is variable else [item])]


def _initial_value(graph, variables, member, families) -> tf.Tensor:
    """A member's initial value; a slot that starts from its variable's `initialized_value()`
    (a moving average) starts from the variable's initial value, which that is at the start."""
    initial = initializer_op(variables[member]).inputs[1]
    source = split_rules.initialized_value_of(initial, families)
    return initial if source is None else _initial_value(graph, variables, source, families)


def _split_gradients(graph, state: _State) -> None:
    """Each recorded gradient of a split variable becomes a gradient of each shard: its rows
    partitioned by id (id % k), with the shard's row ids (id // k)."""
    kept = []
    for record in contracts.read_gradients(graph, unique=False):
        family = state.families.get(record.variable)
        if family is None:
            kept.append(record)
            continue
        values = graph.get_tensor_by_name(record.values)
        indices = graph.get_tensor_by_name(record.indices)
        with tf.name_scope(f"parallax_split/{record.variable}"), tf.device(values.op.device):
            values_parts, ids_parts = _partition(indices, [values], family.shards)
        key = (family.variable, record.indices)
        state.parts[values.name] = (("rows",) + key, [t.name for t in values_parts])
        state.parts[indices.name] = (("ids",) + key, [t.name for t in ids_parts])
        kept += [GradientRecord(family.shard(record.variable, j), values=v.name, indices=i.name)
                 for j, (v, i) in enumerate(zip(values_parts, ids_parts))]
    contracts.replace_gradients(graph, kept)


def _partition(ids, tensors, shards):
    """For each of `tensors` (rows following the ids), its rows of each shard, then the
    shard's local ids (id // k) of each shard."""
    flat = tf.reshape(ids, [-1])
    count = tf.cast(shards, flat.dtype)
    which = tf.cast(tf.math.floormod(flat, count), tf.int32)
    parted = [tf.dynamic_partition(t, which, shards) for t in tensors]
    return (*parted, tf.dynamic_partition(tf.math.floordiv(flat, count), which, shards))


def _apply(graph, state: _State, steps: List[split_rules.Step]) -> None:
    """Build each step's ops, make what waited for a replaced op wait for what stands for it,
    and cut the replaced ops from the variables."""
    replaced = {}  # op -> (its ops per shard, the op standing for it whole or None)
    for step in steps:
        if step.op.name in state.initializers:  # a member's: the shards have their own
            built = ([graph.get_operation_by_name(n) for n in state.initializers[step.op.name]],
                     None)
        else:
            built = _BUILDERS[step.how](graph, state, step, replaced)
        if built is not None:
            replaced[step.op] = built
    _rewire_control(state, replaced)
    detached = None
    for op in replaced:
        for tensor in op.inputs:
            if tensor.dtype == tf.resource and tensor.op.name in state.families:
                if detached is None:
                    detached = tf.compat.v1.placeholder(tf.resource, [],
                                                        name="parallax_split/detached")
                reroute(tensor, detached, [op])


def _shard_inputs(graph, state, op, j) -> list:
    """`op`'s inputs for shard j: a member's handle is its shard's, a split tensor its part."""
    inputs = []
    for tensor in op.inputs:
        if tensor.dtype == tf.resource and tensor.op.name in state.families:
            family = state.families[tensor.op.name]
            inputs.append(graph.get_operation_by_name(
                family.shard(tensor.op.name, j)).outputs[0])
        elif tensor.name in state.parts:
            inputs.append(graph.get_tensor_by_name(state.parts[tensor.name][1][j]))
        else:
            inputs.append(tensor)
    return inputs


def _family_of(state, op) -> Family:
    for tensor in op.inputs:
        if tensor.dtype == tf.resource and tensor.op.name in state.families:
            return state.families[tensor.op.name]
        if tensor.name in state.parts:
            return state.families[state.parts[tensor.name][0][1]]
    raise AssertionError(f"{op.name} reads nothing split")


def _clone(graph, state, step, replaced):
    """The op once per shard, on the shard's handles and parts; whole inputs shared (or, for
    `slice_inputs` and `partition_inputs`, each shard's rows of them)."""
    op, family = step.op, _family_of(state, step.op)
    per_shard = [_shard_inputs(graph, state, op, j) for j in range(family.shards)]
    for i in step.slice_inputs:
        for j, inputs in enumerate(per_shard):
            with tf.name_scope(f"parallax_split/{op.name}"):
                inputs[i] = tf.gather(op.inputs[i], family.rows_of(j))
    for i in step.row_count_inputs:
        for j, inputs in enumerate(per_shard):
            inputs[i] = tf.constant(family.rows_in(j), op.inputs[i].dtype)
    if step.partition_inputs:
        ids_at, updates_at = step.partition_inputs
        with tf.name_scope(f"parallax_split/{op.name}"):
            updates, ids = _partition(op.inputs[ids_at], [op.inputs[updates_at]],
                                      family.shards)
        for j, inputs in enumerate(per_shard):
            inputs[ids_at], inputs[updates_at] = ids[j], updates[j]
    clones = []
    for j, inputs in enumerate(per_shard):
        attrs = dict(op.node_def.attr.items())
        if "_class" in attrs:
            attrs["_class"] = _colocation_of_shard(graph, attrs["_class"], state, replaced, j)
        clone = graph.create_op(
            op.type, inputs, dtypes=[t.dtype for t in op.outputs], name=f"{op.name}/part_{j}",
            attrs=attrs, op_def=op.op_def, compute_device=False)
        tf_private.set_device(clone, op.device)
        clones.append(clone)
    for index, kind in enumerate(step.outputs):
        if kind is not None:
            state.parts[op.outputs[index].name] = (kind, [c.outputs[index].name for c in clones])
    state.op_parts[op.name] = [c.name for c in clones]
    return clones, None


def _colocation_of_shard(graph, attr, state, replaced, j):
    """A clone is colocated with the shard j of a member, or the clone j of a replaced op; not
    with a replaced op that has no clones."""
    groups = []
    for group in attr.list.s:
        target = group.decode()[len("loc:@"):]
        if target in state.families:
            groups.append(f"loc:@{state.families[target].shard(target, j)}".encode())
            continue
        try:
            per_shard = replaced.get(graph.get_operation_by_name(target), (None,))[0]
        except KeyError:  # colocated with an op that is not in the graph: kept as it was
            per_shard = None
        if per_shard:
            groups.append(f"loc:@{per_shard[j].name}".encode())
        elif per_shard is None:
            groups.append(group)
    return tf.compat.v1.AttrValue(list=tf.compat.v1.AttrValue.ListValue(s=groups))


def stand_in(graph: tf.Graph, old: tf.Tensor, new: tf.Tensor) -> None:
    """`new` replaces `old` for every consumer, and for fetches (`replacement`): for a pass
    other than the split that replaces a tensor a script may fetch."""
    state = contracts.read_split_state(graph)
    if state is None:
        state = _State(families={})
        contracts.record_split_state(graph, state)
    reroute(old, new, list(old.consumers()))
    state.whole[old.name] = new.name
    if len(old.op.outputs) == 1:
        state.whole[old.op.name] = new.op.name


def _stands_for(state, old: tf.Tensor, new: tf.Tensor) -> None:
    """`new` replaces `old` for every consumer, and for fetches."""
    reroute(old, new, list(old.consumers()))
    state.whole[old.name] = new.name
    state.whole[old.op.name] = new.op.name  # the op fetched itself (each has one output)


def _reduce(graph, state, step, replaced):
    """A sum over the rows (L2Loss, Sum over the first axis): the sum of the shards' sums."""
    clones, _ = _clone(graph, state, step, replaced)
    with tf.name_scope(f"parallax_split/{step.op.name}"):
        total = tf.add_n([c.outputs[0] for c in clones])
    _stands_for(state, step.op.outputs[0], total)
    return clones, total.op


def _gather(graph, state, step, replaced):
    """A lookup of whole ids: each id's row from its shard, stitched back in the ids' order."""
    op, family = step.op, _family_of(state, step.op)
    ids = op.inputs[1]
    with tf.name_scope(f"parallax_split/{op.name}"):
        with tf.device(ids.op.device):
            positions, local = _partition(ids, [tf.range(tf.size(ids))], family.shards)
        rows = []
        for j in range(family.shards):
            source = _shard_inputs(graph, state, op, j)[0]
            with tf.device(op.device):
                if op.type == "ResourceGather":
                    rows.append(tf.raw_ops.ResourceGather(
                        resource=source, indices=local[j], dtype=op.outputs[0].dtype))
                else:
                    rows.append(tf.gather(source, local[j]))
        with tf.device(ids.op.device):
            stitched = tf.dynamic_stitch(positions, rows)
            looked_up = tf.reshape(stitched, tf.concat(
                [tf.shape(ids), tf.shape(stitched)[1:]], axis=0))
    looked_up.set_shape(op.outputs[0].shape)
    _stands_for(state, op.outputs[0], looked_up)
    return [r.op for r in rows], looked_up.op


def _shape(graph, state, step, replaced):
    """The shape of a member (VariableShape) or of its rows, whole: a constant."""
    op = step.op
    if op.type == "VariableShape":
        shape = tf.TensorShape(op.inputs[0].op.get_attr("shape"))  # the member's (a slot's)
    else:
        shape = op.inputs[0].shape
    with tf.name_scope(f"parallax_split/{op.name}"):
        constant = tf.constant(shape.as_list(), dtype=op.outputs[0].dtype)
    _stands_for(state, op.outputs[0], constant)
    return [], constant.op


def _initialized(graph, state, step, replaced):
    clones, _ = _clone(graph, state, step, replaced)
    with tf.name_scope(f"parallax_split/{step.op.name}"):
        every = tf.reduce_all(tf.stack([c.outputs[0] for c in clones]))
    _stands_for(state, step.op.outputs[0], every)
    return clones, every.op


def _stitch_inputs(graph, state, step, replaced):
    """An op that needs the rows whole reads them stitched from the shards; it is not
    replaced."""
    for tensor in list(step.op.inputs):
        if tensor.name in state.parts:
            reroute(tensor, replacement(graph, tensor.name), [step.op])
    return None


def _stitch(family: Family, parts: List[tf.Tensor]) -> tf.Tensor:
    with tf.name_scope(f"{family.variable}/stitched"):
        return tf.dynamic_stitch([family.rows_of(j) for j in range(family.shards)], parts)


_BUILDERS = {"clone": _clone, "reduce": _reduce, "gather": _gather, "shape": _shape,
             "initialized": _initialized, "stitch_inputs": _stitch_inputs,
             "drop": lambda graph, state, step, replaced: ([], None)}


def _rewire_control(state: _State, replaced: Dict[tf.Operation, tuple]) -> None:
    """A replaced op's control inputs go to its ops per shard (or the one standing for it),
    mapped: a clone of shard j waits for what stands for a replaced op of the same variable in
    shard j, for all of any other op (another variable's shards are other rows). Ops that
    waited for a replaced op wait for what stands for it."""
    variable_of = {op: _family_of(state, op).variable for op in replaced}

    def stand_ins(op, shard, variable):
        if op not in replaced:
            return [op]
        per_shard, whole = replaced[op]
        if shard is not None and per_shard and variable_of[op] == variable:
            return [per_shard[shard]]
        return list(per_shard) + ([whole] if whole is not None else [])

    for old, (per_shard, whole) in replaced.items():
        for j, clone in enumerate(per_shard):
            tf_private.add_control_inputs(
                clone, [c for control in old.control_inputs
                 for c in stand_ins(control, j, variable_of[old])])
    waiting = {op for old in replaced
               for op in tf_private.control_outputs(old)
               if op not in replaced}
    for op in waiting:
        controls = [c for control in op.control_inputs
                    for c in stand_ins(control, None, None)]
        tf_private.set_control_inputs(op, controls)
