"""Dynamic embeddings on the servers (parallax.dynamic_embedding, parallax/embeddings/).

The plan splits a table's variable over every machine's server (planning/proposal.py:
table_splits), row r in part r % k (split_variables.py). This pass gives each part its own keys
beside its rows: an id belongs to the part its hash names (`owner`), whose server gives it a
row of its own (give_rows, in the part's critical section, so that workers giving rows at once
agree). A lookup's distinct ids are partitioned by owner, each part's rows found on its server,
and stitched back: the one-device allocation the script built (one table of keys on no server)
is cut, and never runs. What reads the script's table of keys reads the parts instead: its
export (`table.export()`) is the parts' exports together, its size theirs summed. No worker
holds a key or a row.

A checkpoint holds a table as one device lays it out, whatever the job that wrote it: its n
keys with rows 0..n-1 and the variable and slots in those rows (`rewrite_uses`). A Saver's save
in a job of k parts writes the rows in that order; its restore gives each key a row of its part
in this job and moves the rows there. A checkpoint thus restores onto one device and onto any
number of servers.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf

from parallax import contracts, tf_private
from parallax.contracts import TableRecord, read_tables
from parallax.embeddings.initial_rows import key_bits, mix
from parallax.embeddings.table import give_rows
from parallax.planning.job_plan import Plan
from parallax.planning.problem import shards_in
from parallax.rewriting.passes import graph_pass, with_servers
from parallax.rewriting.rewire import reroute
from parallax.rewriting.split_variables import replacement, split_families, stand_in

_OWNER_SALT = np.uint64(0x5DEECE66D)  # apart from the first values' draw of the same hash
_REWRITTEN = "parallax_dynamic_tables_rewritten"  # ops rewrite_uses has rewritten


def owner(keys: tf.Tensor, parts: int) -> tf.Tensor:
    """The part (of `parts`) each key belongs to, the same in every process."""
    bits = tf.bitwise.right_shift(mix(tf.bitwise.bitwise_xor(key_bits(keys), _OWNER_SALT)),
                                  np.uint64(33))
    return tf.cast(tf.math.floormod(tf.cast(bits, tf.int64), parts), tf.int32)


@graph_pass(needs=["server variables placed", "worker ops pinned"],
            produces=["dynamic tables on servers"], runs_if=with_servers)
def give_rows_on_servers(graph: tf.Graph, plan: Plan) -> tf.Graph:
    for record in read_tables(graph):
        with graph.as_default():
            parts = [_Part.make(record, j, handle)
                     for j, handle in enumerate(_row_handles(graph, record))]
            for part in parts:  # the ids each server holds, in the metrics
                with tf.device(part.device):
                    contracts.record_table_size(
                        graph, f"{record.name} ids on server {plan.server_of(part.rows.op.name)}",
                        tf.raw_ops.LookupTableSizeV2(table_handle=part.keys))
            for unique_name, given_name, step_name in record.lookups:
                unique, given = (graph.get_tensor_by_name(name)
                                 for name in (unique_name, given_name))
                step = graph.get_tensor_by_name(step_name) if step_name else None
                consumers = list(given.consumers())
                with tf.device(unique.op.device), tf.name_scope(f"{record.name}_parts"):
                    reroute(given, _rows(unique, parts, step), consumers)
    rewrite_uses(graph)
    return graph


def rewrite_uses(graph: tf.Graph) -> None:
    """The ops on a table's keys and the Savers' saves and restores of a table not rewritten
    yet (those of the script, then a Saver or an export built later), rewritten for its parts."""
    done = graph.get_collection_ref(_REWRITTEN)
    for record in read_tables(graph):
        parts = _Part.found(graph, record)
        if not parts:
            continue
        with graph.as_default(), tf.name_scope(f"{record.name}_parts"):
            for table in filter(None, (record.keys, record.seen)):
                for op in list(graph.get_operation_by_name(table).outputs[0].consumers()):
                    if f"{record.name}:{op.name}" not in done:
                        done.append(f"{record.name}:{op.name}")
                        _read_parts(graph, op, record, [
                            part.keys if table == record.keys else part.seen
                            for part in parts])
            if len(parts) > 1:
                for op in graph.get_operations():
                    if op.type in ("SaveV2", "RestoreV2") and \
                            f"{record.name}:{op.name}" not in done:
                        done.append(f"{record.name}:{op.name}")
                        _as_one_device(graph, op, record, parts)


@dataclasses.dataclass
class _Part:
    """A part's keys (a handle) beside its rows (a handle), on their server, with its counts
    of ids without a row (min_count), and the lock its rows are given in (where this graph
    gives them)."""
    record: TableRecord
    index: int
    rows: tf.Tensor
    keys: tf.Tensor
    seen: Optional[tf.Tensor] = None
    lock: Optional[tf.CriticalSection] = None

    @property
    def device(self) -> str:
        return self.rows.op.device

    @staticmethod
    def keys_name(record: TableRecord, index: int, table: str = "keys") -> str:
        return f"{record.name}/{table}/part_{index}"

    @classmethod
    def make(cls, record: TableRecord, index: int, rows: tf.Tensor) -> "_Part":
        name = cls.keys_name(record, index)
        with tf.device(rows.op.device):
            keys = tf.raw_ops.MutableHashTableV2(
                key_dtype=tf.as_dtype(record.key_dtype), value_dtype=tf.int64,
                shared_name=name, use_node_name_sharing=False, name=name)
            seen = None
            if record.min_count > 1:
                seen_name = cls.keys_name(record, index, "seen")
                seen = tf.raw_ops.MutableHashTableOfTensorsV2(
                    key_dtype=tf.as_dtype(record.key_dtype), value_dtype=tf.int64,
                    value_shape=[2], shared_name=seen_name, use_node_name_sharing=False,
                    name=seen_name)
            # One for all the table's lookups: TensorFlow refuses two critical sections
            # of one graph on the same resources.
            lock = tf.CriticalSection(name=f"{name}/lock", shared_name=f"{name}/lock")
        return cls(record, index, rows, keys, seen, lock)

    @classmethod
    def found(cls, graph: tf.Graph, record: TableRecord) -> List["_Part"]:
        names = {op.name for op in graph.get_operations()}
        handles = _row_handles(graph, record)
        found = []
        for j, rows in enumerate(handles):
            if cls.keys_name(record, j) in names:
                seen = cls.keys_name(record, j, "seen")
                found.append(cls(record, j, rows,
                                 graph.get_tensor_by_name(cls.keys_name(record, j) + ":0"),
                                 graph.get_tensor_by_name(seen + ":0") if seen in names
                                 else None))
        return found

    def give(self, unique: tf.Tensor, parts: int, step: Optional[tf.Tensor]) -> tf.Tensor:
        with tf.device(self.device):
            return give_rows(unique, self.keys, self.rows, self.record, self.index, parts,
                             self.lock, self.seen, step)[0]


def _row_handles(graph: tf.Graph, record: TableRecord) -> List[tf.Tensor]:
    """The handles of the variable's parts: its shards, or itself where it is whole."""
    names = {op.name for op in graph.get_operations() if op.type == "VarHandleOp"}
    return [graph.get_operation_by_name(name).outputs[0]
            for name in shards_in(record.variable, names) or [record.variable]]


def _rows(unique: tf.Tensor, parts: List[_Part], step: Optional[tf.Tensor]) -> tf.Tensor:
    """The rows of distinct ids `unique`, each given by its part (counted in `step`)."""
    if len(parts) == 1:
        return parts[0].give(unique, 1, step)
    owners = owner(unique, len(parts))
    keys = tf.dynamic_partition(unique, owners, len(parts))
    positions = tf.dynamic_partition(tf.range(tf.size(unique)), owners, len(parts))
    return tf.dynamic_stitch(positions, [part.give(keys[j], len(parts), step)
                                         for j, part in enumerate(parts)])


def _read_parts(graph: tf.Graph, op: tf.Operation, record: TableRecord,
                tables: List[tf.Tensor]) -> None:
    """An op on one of the script's hash tables (its keys, its counts), on the parts' `tables`
    instead: an export, a size, or an import (of keys: only in a job of one part, whose rows
    are one device's; a restore of more parts moves the rows, `_as_one_device`)."""
    key_dtype = tf.as_dtype(record.key_dtype)
    with tf.device(op.device):
        if op.type == "LookupTableExportV2":
            exports = [tf.raw_ops.LookupTableExportV2(
                table_handle=table, Tkeys=key_dtype, Tvalues=op.get_attr("Tvalues"))
                for table in tables]
            for index in (0, 1):
                stand_in(graph, op.outputs[index], tf.concat([e[index] for e in exports], 0))
        elif op.type == "LookupTableSizeV2":
            stand_in(graph, op.outputs[0], tf.add_n([
                tf.raw_ops.LookupTableSizeV2(table_handle=table) for table in tables]))
        elif op.type == "LookupTableImportV2" and (
                len(tables) == 1 or op.inputs[0].op.name == record.seen):
            keys, values = op.inputs[1], op.inputs[2]
            owners = owner(keys, len(tables))
            split_keys = tf.dynamic_partition(keys, owners, len(tables))
            split_values = tf.dynamic_partition(values, owners, len(tables))
            imported = []
            for j, table in enumerate(tables):
                with tf.device(table.op.device):
                    imported.append(tf.raw_ops.LookupTableImportV2(
                        table_handle=table, keys=split_keys[j], values=split_values[j]))
            for waiting in tf_private.control_outputs(op):  # a Saver's restore
                tf_private.add_control_inputs(waiting, imported)


def _as_one_device(graph: tf.Graph, op: tf.Operation, record: TableRecord,
                   parts: List[_Part]) -> None:
    """A Saver's save or restore `op`, where it holds `record`'s table, rewritten to write and
    read one device's layout (this module's docstring)."""
    if op.inputs[1].op.type != "Const":
        return
    names = [name.decode() for name in tf.make_ndarray(op.inputs[1].op.get_attr("value"))]
    at = {name: i for i, name in enumerate(names)}
    if f"{record.name}/keys-keys" not in at:
        return
    keys_index, rows_index = at[f"{record.name}/keys-keys"], at[f"{record.name}/keys-values"]
    members = [m for m in _members(graph, record) if m in at]
    if op.type == "SaveV2":
        tensors = list(op.inputs[3:])
        keys, rows = tensors[keys_index], tensors[rows_index]
        order = tf.argsort(rows, stable=True)
        held = tf.gather(rows, order)
        tf_private.update_input(op, 3 + keys_index, tf.gather(keys, order))
        tf_private.update_input(op, 3 + rows_index, tf.range(tf.size(rows, out_type=tf.int64)))
        first = tf.range(tf.size(held, out_type=tf.int64))
        for member in members:
            tf_private.update_input(op, 3 + at[member], _moved(tensors[at[member]], held, first))
        return
    keys, rows = op.outputs[keys_index], op.outputs[rows_index]
    new_rows = _laid_out(keys, parts)
    for member in members:
        restored = op.outputs[at[member]]
        consumers = list(restored.consumers())
        reroute(restored, _moved(restored, rows, new_rows), consumers)
    owners = owner(keys, len(parts))
    split_keys = tf.dynamic_partition(keys, owners, len(parts))
    split_rows = tf.dynamic_partition(new_rows, owners, len(parts))
    imports = []
    for j, part in enumerate(parts):
        with tf.device(part.device):
            imports.append(tf.raw_ops.LookupTableImportV2(
                table_handle=part.keys, keys=split_keys[j], values=split_rows[j]))
    for reader in _script_imports(record, keys):
        for waiting in tf_private.control_outputs(reader):
            tf_private.add_control_inputs(waiting, imports)


def _moved(value: tf.Tensor, sources: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
    """`value` with its rows `sources` at rows `targets`, and its other rows (a row no id has:
    the slot's first value, Adagrad's 0.1) at the other rows, in order."""
    count = tf.shape(value, out_type=tf.int64)[0]

    def others(taken):
        free = tf.ones([count], tf.bool)
        free = tf.tensor_scatter_nd_update(free, taken[:, None],
                                           tf.zeros(tf.shape(taken), tf.bool))
        return tf.where(free)[:, 0]

    return tf.scatter_nd(tf.concat([targets, others(targets)], 0)[:, None],
                         tf.gather(value, tf.concat([sources, others(sources)], 0)),
                         tf.shape(value, out_type=tf.int64))


def _laid_out(keys: tf.Tensor, parts: List[_Part]) -> tf.Tensor:
    """Rows for `keys` in a job of these parts: the ith key of part j, in their order, at
    row j + k * i."""
    k = len(parts)
    owners = owner(keys, k)
    positions = tf.dynamic_partition(tf.range(tf.size(keys)), owners, k)
    given = []
    for j, part in enumerate(parts):
        count = tf.size(positions[j], out_type=tf.int64)
        room = tf.debugging.assert_less_equal(
            count, tf.constant(len(range(j, part.record.capacity, k)), tf.int64),
            message=f"dynamic embedding {part.record.name}: the checkpoint has more ids "
                    f"of server {j}'s part than its capacity")
        with tf.control_dependencies([room]):
            given.append(j + k * tf.range(count, dtype=tf.int64))
    return tf.dynamic_stitch(positions, given)


def _script_imports(record: TableRecord, keys: tf.Tensor) -> List[tf.Operation]:
    """The imports of restored `keys` into the script's table (which the parts replace)."""
    return [op for op in keys.consumers() if op.type == "LookupTableImportV2"
            and op.inputs[0].op.name == record.keys]


def _members(graph: tf.Graph, record: TableRecord) -> List[str]:
    """The table's variable and its slots, by name (split with it)."""
    for family in split_families(graph):
        if family.variable == record.variable:
            return list(family.members)
    return [record.variable]


def keys_saveables(graph: tf.Graph) -> Dict[str, tf_private.SaveableObject]:
    """Each table's keys (and counts) as a Saver saves a hash table ('<name>/keys-keys',
    '-values'), for a Saver built on the rewritten graph (runtime/checkpoint.py)."""
    saveables = {}
    for record in read_tables(graph):
        keys, rows = (_stand_in_of(graph, name) for name in record.exported)
        saveables[f"{record.name}/keys"] = _KeysSaveable(
            graph.get_operation_by_name(record.keys).outputs[0], keys, rows,
            f"{record.name}/keys")
        if record.seen:
            handle = graph.get_operation_by_name(record.seen).outputs[0]
            with graph.as_default(), tf.name_scope(f"{record.name}_parts"):
                seen = tf.raw_ops.LookupTableExportV2(
                    table_handle=handle, Tkeys=tf.as_dtype(record.key_dtype), Tvalues=tf.int64)
            saveables[f"{record.name}/seen"] = _KeysSaveable(handle, seen[0], seen[1],
                                                             f"{record.name}/seen")
    return saveables


def _stand_in_of(graph: tf.Graph, name: str) -> tf.Tensor:
    stand_in_tensor = replacement(graph, name)
    return graph.get_tensor_by_name(name) if stand_in_tensor is None else stand_in_tensor


class _KeysSaveable(tf_private.SaveableObject):
    """A table of keys' save and restore, as TensorFlow's MutableHashTable has them."""

    def __init__(self, handle: tf.Tensor, keys: tf.Tensor, rows: tf.Tensor, name: str):
        self._handle = handle
        super().__init__(handle, [tf_private.SaveSpec(keys, "", f"{name}-keys"),
                                  tf_private.SaveSpec(rows, "", f"{name}-values")], name)

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes  # a table of keys takes any number
        with tf.device(self._handle.device):
            return tf.raw_ops.LookupTableImportV2(table_handle=self._handle,
                                                  keys=restored_tensors[0],
                                                  values=restored_tensors[1])
