"""Dynamic embeddings on the servers (parallax.dynamic_embedding, parallax/embeddings/).

The plan splits a table's variable over every machine's server (planning/proposal.py:
table_splits), row r in part r % k (split_variables.py). This pass gives each part its own keys
beside its rows: an id belongs to the part its hash names (`owner`), whose server gives it a
row of its own (give_rows, in the part's critical section, so that workers giving rows at once
agree). A lookup's distinct ids are partitioned by owner, each part's rows found on its server,
and stitched back: the one-device allocation the script built (one table of keys on no server)
is cut, and never runs. What reads the script's table of keys reads the parts instead: its
export (a Saver's, `table.export()`) is the parts' exports together, its import (a restore)
gives each part its keys, its size is theirs summed. No worker holds a key or a row.
"""
from __future__ import annotations

from typing import List

import numpy as np
import tensorflow as tf

from parallax import tf_private
from parallax.embeddings.initial_rows import key_bits, mix
from parallax.contracts import TableRecord, read_tables
from parallax.embeddings.table import give_rows
from parallax.planning.job_plan import Plan
from parallax.planning.problem import shard_name
from parallax.rewriting.passes import graph_pass, with_servers
from parallax.rewriting.rewire import reroute
from parallax.rewriting.split_variables import stand_in

_OWNER_SALT = np.uint64(0x5DEECE66D)  # apart from the first values' draw of the same hash


def owner(keys: tf.Tensor, parts: int) -> tf.Tensor:
    """The part (of `parts`) each key belongs to, the same in every process."""
    bits = tf.bitwise.right_shift(mix(tf.bitwise.bitwise_xor(key_bits(keys), _OWNER_SALT)),
                                  np.uint64(33))
    return tf.cast(tf.math.floormod(tf.cast(bits, tf.int64), parts), tf.int32)


@graph_pass(needs=["server variables placed", "worker ops pinned"],
            produces=["dynamic tables on servers"], runs_if=with_servers)
def give_rows_on_servers(graph: tf.Graph, plan: Plan) -> tf.Graph:
    for record in read_tables(graph):
        handles = _part_handles(graph, record)
        with graph.as_default():
            parts = [_Part(record, j, handle) for j, handle in enumerate(handles)]
            for unique_name, given_name in record.lookups:
                unique, given = (graph.get_tensor_by_name(name)
                                 for name in (unique_name, given_name))
                consumers = list(given.consumers())
                with tf.device(unique.op.device), tf.name_scope(f"{record.name}_parts"):
                    reroute(given, _rows(unique, parts), consumers)
            _read_parts(graph, record, parts)
    return graph


def _part_handles(graph: tf.Graph, record: TableRecord) -> List[tf.Tensor]:
    """The handles of the variable's parts: its shards, or itself where it is whole."""
    names = []
    while shard_name(record.variable, len(names)) in {op.name for op in graph.get_operations()
                                                      if op.type == "VarHandleOp"}:
        names.append(shard_name(record.variable, len(names)))
    return [graph.get_operation_by_name(name).outputs[0]
            for name in names or [record.variable]]


class _Part:
    """A part's keys and lock, on its rows' server."""

    def __init__(self, record: TableRecord, index: int, handle: tf.Tensor):
        self.record, self.index, self.handle = record, index, handle
        self.device = handle.op.device
        name = f"{record.name}/keys/part_{index}"
        with tf.device(self.device):
            self.keys = tf.raw_ops.MutableHashTableV2(
                key_dtype=tf.as_dtype(record.key_dtype), value_dtype=tf.int64,
                shared_name=name, use_node_name_sharing=False, name=name)
            self.lock = tf.CriticalSection(name=f"{name}/lock", shared_name=f"{name}/lock")

    def rows(self, unique: tf.Tensor, parts: int) -> tf.Tensor:
        with tf.device(self.device):
            return give_rows(unique, self.keys, self.handle, self.record, self.index, parts,
                             self.lock)[0]


def _rows(unique: tf.Tensor, parts: List[_Part]) -> tf.Tensor:
    """The rows of distinct ids `unique`, each given by its part."""
    if len(parts) == 1:
        return parts[0].rows(unique, 1)
    owners = owner(unique, len(parts))
    keys = tf.dynamic_partition(unique, owners, len(parts))
    positions = tf.dynamic_partition(tf.range(tf.size(unique)), owners, len(parts))
    return tf.dynamic_stitch(positions, [part.rows(keys[j], len(parts))
                                         for j, part in enumerate(parts)])


def _read_parts(graph: tf.Graph, record: TableRecord, parts: List[_Part]) -> None:
    """The script's reads and writes of its table of keys, of the parts' keys instead."""
    script_keys = graph.get_operation_by_name(record.keys).outputs[0]
    key_dtype = tf.as_dtype(record.key_dtype)
    for op in list(script_keys.consumers()):
        with tf.device(op.device), tf.name_scope(f"{record.name}_parts"):
            if op.type == "LookupTableExportV2":
                exports = [tf.raw_ops.LookupTableExportV2(table_handle=part.keys,
                                                          Tkeys=key_dtype, Tvalues=tf.int64)
                           for part in parts]
                for index in (0, 1):
                    stand_in(graph, op.outputs[index],
                             tf.concat([e[index] for e in exports], 0))
            elif op.type == "LookupTableSizeV2":
                stand_in(graph, op.outputs[0], tf.add_n([tf.raw_ops.LookupTableSizeV2(
                    table_handle=part.keys) for part in parts]))
            elif op.type == "LookupTableImportV2":
                _import(op, record, parts)


def _import(op: tf.Operation, record: TableRecord, parts: List[_Part]) -> None:
    """A restore of the script's keys (and their rows, by the variable's own restore): each
    part takes its keys, which must have the rows a job of as many parts gave them."""
    keys, rows = op.inputs[1], op.inputs[2]
    owners = owner(keys, len(parts))
    split_keys = tf.dynamic_partition(keys, owners, len(parts))
    split_rows = tf.dynamic_partition(rows, owners, len(parts))
    imports = []
    for j, part in enumerate(parts):
        placed = tf.debugging.assert_equal(
            tf.math.floormod(split_rows[j], len(parts)), tf.cast(j, tf.int64),
            message=f"dynamic embedding {record.name}: the checkpoint's rows were given out "
                    f"over another number of servers than this job's {len(parts)}")
        with tf.control_dependencies([placed]), tf.device(part.device):
            imports.append(tf.raw_ops.LookupTableImportV2(
                table_handle=part.keys, keys=split_keys[j], values=split_rows[j]))
    for waiting in tf_private.control_outputs(op):  # a Saver's restore op
        tf_private.add_control_inputs(waiting, imports)
