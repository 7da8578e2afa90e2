"""`parallax.dynamic_embedding`: an embedding table whose row for an id is made the first time
the id is looked up in training, trained by any tf.compat.v1 optimizer (docs/dynamic_embeddings.md).

What one device computes, which a distributed job equals:

- The table is a trainable variable `<name>/embedding` of `capacity` rows, and a hash table
  `<name>/keys` mapping each id seen to its row. A lookup finds its ids' rows; an id not yet in
  the table is given the next free row, which is set to the id's first value
  (initial_rows.py: drawn from the id and the table's name, not from the order ids came in).
- The lookup is a gather of the variable's rows, so its gradient is sparse (IndexedSlices) and
  any optimizer applies it as to a static table's rows, its slots kept per row: per id.
  A row no id has reached stays zero, its slots at their first values, and no optimizer
  moves it.
- With min_count, an id gets its row at the min_count-th step it is seen in (`_admitted`);
  until then it looks up its first value.
- Rows, slots and the keys are variables and saveable tables: a Saver saves them.

Under Parallax the variable is split over the parameter servers by a hash of the id and each
server keeps the keys of its part (rewriting/passes/dynamic_tables.py); values never depend on
which row an id was given, so the two forms compute the same values.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple, Union

import tensorflow as tf

from parallax import contracts
from parallax.contracts import TableRecord
from parallax.embeddings.initial_rows import RowInitializer, from_user
from parallax.errors import ParallaxError

COMBINERS = ("sum", "mean", "sqrtn")


class DynamicEmbedding:
    """A table made by `parallax.dynamic_embedding`; `lookup` its ids."""

    def __init__(self, name: str, dim: int, capacity: int, key_dtype: tf.DType,
                 initializer, dtype: tf.DType, min_count: int = 1):
        graph = tf.compat.v1.get_default_graph()
        if any(record.name == name for record in contracts.read_tables(graph)):
            raise ParallaxError(f"dynamic embedding '{name}': the graph has a table of that "
                                "name already; give each table its own name")
        if key_dtype not in (tf.int64, tf.string):
            raise ParallaxError(f"dynamic embedding '{name}': keys of {key_dtype.name}; a "
                                "table's keys are tf.int64 or tf.string")
        if not (isinstance(dim, int) and dim > 0 and isinstance(capacity, int) and capacity > 0):
            raise ParallaxError(f"dynamic embedding '{name}': dim ({dim!r}) and capacity "
                                f"({capacity!r}) must be positive integers")
        if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
            raise ParallaxError(f"dynamic embedding '{name}': min_count must be a whole "
                                f"number >= 1 (1: a row at an id's first step), got "
                                f"{min_count!r}")
        self.name, self.dim, self.capacity, self.key_dtype = name, dim, capacity, key_dtype
        self._initializer = from_user(initializer, name, dim)
        with tf.compat.v1.name_scope(name):
            self.variable = tf.compat.v1.Variable(
                lambda: tf.zeros([capacity, dim], dtype), name="embedding", use_resource=True)
        # Named whole, as a Saver names its keys in a checkpoint: '<name>/keys-keys'.
        self.keys = tf.lookup.experimental.MutableHashTable(
            key_dtype, tf.int64, default_value=-1, name=f"{name}/keys")
        self._given: List[tf.Tensor] = []  # each lookup's rows of its distinct ids
        # An id without a row: the steps it was seen in, and the last of them.
        self.seen = tf.lookup.experimental.MutableHashTable(
            key_dtype, tf.int64, default_value=[0, -1], name=f"{name}/seen"
        ) if min_count > 1 else None
        with tf.compat.v1.name_scope(name):
            self._exported = self.keys.export()  # what the rewrite reads from the servers
        self._record = TableRecord(
            name, dim, capacity, key_dtype.name, dtype.name, self.variable.op.name,
            self.keys.resource_handle.op.name, dataclasses.asdict(self._initializer),
            min_count, self.seen.resource_handle.op.name if self.seen else "",
            exported=[tensor.name for tensor in self._exported])
        contracts.record_table(graph, self._record)

    def lookup(self, ids: Union[tf.Tensor, tf.SparseTensor], combiner: Optional[str] = None,
               sp_weights: Optional[tf.SparseTensor] = None, name: Optional[str] = None):
        """The rows of `ids`: a tensor of ids gives [*ids.shape, dim]; a SparseTensor of ids
        [batch, n] gives [batch, dim], its rows combined per example by `combiner` ("mean" if
        not given; "sum", "sqrtn"), weighted by `sp_weights` as
        tf.nn.embedding_lookup_sparse does. An id not in the table is given its row (with
        min_count, once it was seen in that many steps; until then its row is its first value,
        which no optimizer moves)."""
        sparse = isinstance(ids, tf.SparseTensor)
        values = ids.values if sparse else tf.convert_to_tensor(ids)
        if values.dtype != self.key_dtype:
            raise ParallaxError(
                f"dynamic embedding '{self.name}': ids of {values.dtype.name}, the table's "
                f"keys are {self.key_dtype.name}; cast them (tf.cast, or "
                "tf.strings.as_string) before the lookup")
        if combiner is not None and (not sparse or combiner not in COMBINERS):
            raise ParallaxError(f"dynamic embedding '{self.name}': combiner {combiner!r} is "
                                f"for a SparseTensor of ids, one of {', '.join(COMBINERS)}")
        with tf.name_scope(name or f"{self.name}_lookup"):
            flat = tf.reshape(values, [-1])
            unique, position = tf.unique(flat, out_idx=tf.int64)
            # A table's lookups give rows one after the other, not at once (two giving the
            # same new id a row each).
            step = self._step()
            with tf.control_dependencies(self._given[-1:]):
                given, write = give_rows(unique, self.keys.resource_handle,
                                         self.variable.handle, self._record,
                                         seen=None if self.seen is None
                                         else self.seen.resource_handle,
                                         step=step)
            self._given.append(given)
            self._record.lookups.append([unique.name, given.name,
                                         "" if step is None else step.name])
            self._record.first_values.append(write.name)
            contracts.record_table(tf.compat.v1.get_default_graph(), self._record)
            if sparse:
                return self._combined(ids, unique, given, position, sp_weights,
                                      combiner or "mean")
            if self.seen is None:
                found = tf.nn.embedding_lookup(self.variable, tf.gather(given, position))
            else:
                found = tf.gather(self._unique_rows(unique, given), position)
            return tf.reshape(found, tf.concat([tf.shape(values), [self.dim]], 0))

    def _step(self) -> Optional[tf.Tensor]:
        """The global step, which min_count counts an id's steps by (each worker's the same)."""
        if self.seen is None:
            return None
        step = tf.compat.v1.train.get_global_step()
        if step is None:
            raise ParallaxError(
                f"dynamic embedding '{self.name}': min_count counts the steps an id is seen "
                "in by the global step; create it (tf.compat.v1.train.get_or_create_global_"
                "step()) before the lookup, and pass it to minimize")
        return tf.cast(tf.identity(step), tf.int64)

    def _unique_rows(self, unique: tf.Tensor, given: tf.Tensor) -> tf.Tensor:
        """The rows of distinct ids `unique`: gathered where they have one (`given`), their
        first values where they have none yet (min_count), which no gradient reaches."""
        if self.seen is None:
            return tf.nn.embedding_lookup(self.variable, given)
        stored, waiting = (tf.cast(tf.where(condition)[:, 0], tf.int32)
                           for condition in (given >= 0, given < 0))
        first = RowInitializer(**self._record.initializer).rows(
            tf.gather(unique, waiting), self.dim, self.variable.dtype.base_dtype)
        return tf.dynamic_stitch([stored, waiting], [
            tf.nn.embedding_lookup(self.variable, tf.gather(given, stored)), first])

    def _combined(self, ids, unique, given, position, sp_weights, combiner):
        """Each example's rows combined, as tf.nn.embedding_lookup_sparse does, from a gather of
        the distinct ids' rows (it reads a variable whole when it has no weights)."""
        segments = ids.indices[:, 0]
        count = ids.dense_shape[0]
        rows = self._unique_rows(unique, given)
        if sp_weights is None:
            combine = {"sum": tf.sparse.segment_sum, "mean": tf.sparse.segment_mean,
                       "sqrtn": tf.sparse.segment_sqrt_n}[combiner]
            return combine(rows, position, segments, num_segments=count)
        weights = tf.cast(sp_weights.values, rows.dtype)
        weighted = tf.gather(rows, position) * weights[:, None]
        total = tf.math.unsorted_segment_sum(weighted, segments, count)
        if combiner == "sum":
            return total
        norm = weights if combiner == "mean" else weights * weights
        norm = tf.math.unsorted_segment_sum(norm, segments, count)
        norm = norm if combiner == "mean" else tf.sqrt(norm)
        return tf.math.divide_no_nan(total, norm[:, None])

    def size(self) -> tf.Tensor:
        """The number of ids in the table."""
        return self.keys.size()

    def export(self):
        """(keys, rows' values) of every id in the table, in no particular order."""
        keys, rows = self._exported
        return keys, tf.gather(self.variable.read_value(), rows)


def give_rows(unique: tf.Tensor, keys: tf.Tensor, rows: tf.Tensor, record: TableRecord,
              part: int = 0, parts: int = 1, lock: Optional[tf.CriticalSection] = None,
              seen: Optional[tf.Tensor] = None, step: Optional[tf.Tensor] = None
              ) -> Tuple[tf.Tensor, tf.Operation]:
    """The rows of distinct ids `unique` in part `part` of `parts` of a table: rows
    `part + parts * i` of its variable, whose handle `rows` holds its row i. The part's ids
    not in its table `keys` (a handle) are given its next rows (the ith id in it has row i),
    set to their first values; where workers share the part, this is done in its critical
    section `lock`, so that two workers giving rows at once give an id one row. Also the write
    of the first values.

    With min_count, an id gets a row at the min_count-th step it is seen in (`step`, the
    global step), and -1 until then: the part's table `seen` counts its steps, a step once
    however many workers and lookups see it (it keeps the last step counted), so every
    worker of a step finds the same count without waiting for the others."""
    limit = len(range(part, record.capacity, parts))
    written = []

    def give():
        found = tf.raw_ops.LookupTableFindV2(table_handle=keys, keys=unique,
                                             default_value=tf.constant(-1, tf.int64))
        missing = tf.where(found < 0)[:, 0]
        counted = []
        if seen is not None:
            missing, counted = _admitted(unique, missing, seen, step, record.min_count)
        new_keys = tf.gather(unique, missing)
        start = tf.raw_ops.LookupTableSizeV2(table_handle=keys)
        room = tf.debugging.assert_less_equal(
            start + tf.size(new_keys, out_type=tf.int64), tf.constant(limit, tf.int64),
            message=f"dynamic embedding {record.name} is full: its {record.capacity} rows "
                    "(capacity) are given out; make it larger")
        with tf.control_dependencies([room]):
            local = start + tf.range(tf.size(new_keys, out_type=tf.int64), dtype=tf.int64)
        values = RowInitializer(**record.initializer).rows(new_keys, record.dim,
                                                           tf.as_dtype(record.dtype))
        new_rows = part + parts * local
        with tf.control_dependencies([local]):  # after the size is read
            written.append(tf.raw_ops.ResourceScatterUpdate(resource=rows, indices=local,
                                                            updates=values))
            writes = [tf.raw_ops.LookupTableInsertV2(table_handle=keys, keys=new_keys,
                                                     values=new_rows), written[0]] + counted
        found_rows = tf.tensor_scatter_nd_update(found, missing[:, None], new_rows)
        with tf.control_dependencies(writes):  # on an op of their own: grappler keeps it
            return tf.identity(found_rows)

    given = give() if lock is None else lock.execute(give)
    return given, written[0]


def _admitted(unique, missing, seen, step, min_count):
    """Of the ids `unique[missing]` (not in the table), those seen in min_count steps with
    this one; and the writes that count this step for the others and forget the admitted."""
    absent = tf.gather(unique, missing)
    counts = tf.raw_ops.LookupTableFindV2(table_handle=seen, keys=absent,
                                          default_value=tf.constant([0, -1], tf.int64))
    count = counts[:, 0] + tf.cast(tf.not_equal(counts[:, 1], step), tf.int64)
    admitted = count >= min_count
    waiting = tf.logical_not(admitted)
    writes = [tf.raw_ops.LookupTableInsertV2(
        table_handle=seen, keys=tf.boolean_mask(absent, waiting),
        values=tf.boolean_mask(tf.stack([count, tf.fill(tf.shape(count), step)], 1), waiting)),
        tf.raw_ops.LookupTableRemoveV2(table_handle=seen,
                                       keys=tf.boolean_mask(absent, admitted))]
    return tf.boolean_mask(missing, admitted), writes


def dynamic_embedding(name: str, dim: int, capacity: int, key_dtype: tf.DType = tf.int64,
                      initializer=None, dtype: tf.DType = tf.float32,
                      min_count: int = 1) -> DynamicEmbedding:
    """An embedding table whose rows appear as ids do (docs/dynamic_embeddings.md).

    name: the table's own name (its variable is `<name>/embedding`, its keys `<name>/keys`);
        two tables of a graph may not share it.
    dim: the row's length.
    capacity: the most ids the table holds; memory for that many rows (and the optimizer's
        slots of as many) is reserved. Under Parallax it is split over the servers.
    key_dtype: tf.int64 or tf.string.
    initializer: a new id's row, drawn from the id (see initial_rows.from_user).
    min_count: the steps an id must be seen in (by the global step) before it gets a row;
        until then its lookup is its first value and nothing is stored for it but its count.
    """
    return DynamicEmbedding(name, dim, capacity, tf.as_dtype(key_dtype), initializer,
                            tf.as_dtype(dtype), min_count)
