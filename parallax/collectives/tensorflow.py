"""Collectives by TensorFlow's own ops (CollectiveReduceV2, CollectiveGatherV2,
CollectiveBcastSendV2/RecvV2: a ring over the workers' gRPC servers on CPU, NCCL on GPUs), as
MultiWorkerMirroredStrategy runs them. Every worker has a server of the job's cluster
(launch.py gives workers ports), and a session that runs collectives is one of that server
with worker 0 as the group leader, which resolves each group's and instance's members.

Beside parameter servers, a step's collectives run apart from the step (`for_steps`): a run
holding collective ops takes its step id from a sequence all workers share, so the workers'
steps would meet on a server under one step id, which mixes them up (tensorflow/tensorflow
#33920). Each collective of a step is a loop of its own instead, fed and read through two
queues of the worker, run by a thread of the runner under a step sequence of its own
(_CollectiveLoop); the step itself holds none. The initial broadcast, run alone, stays in.

Two rules of these ops shape what is here. An instance key names one collective and must be
the same on every worker: every worker builds the same collectives in the same order (it runs
the same script and rewrite), so a count on this object numbers them. And an instance keeps
the shape of its first run: a tensor whose size changes from step to step (a sparse gradient's
rows) is padded to one of a few sizes, each with a key of its own (`_padded`)."""
from __future__ import annotations

import copy
import itertools
import logging
import math
import threading
from typing import Callable, Dict, List, Sequence, Tuple

import tensorflow as tf

from parallax.cluster import Cluster
from parallax import contracts
from parallax.collectives.base import Collectives

LEADER = "/job:worker/replica:0/task:0"
ALL_WORKERS = 1  # the group key of every worker; the machine stages' groups follow
# Dense gradients travel packed, in buckets of at most this many bytes each: one collective
# per tensor is slower than one per bucket (a ring's steps per tensor; Horovod fuses too).
BUCKET_BYTES = 32 * 1024 * 1024
SIZES_PER_DOUBLING = 4  # padded sizes 2^(k/4): at most 19% of padding
_PADDED_KEYS = 32 * SIZES_PER_DOUBLING + 1  # keys reserved per padded collective
APART_SCOPE = "parallax_apart_"  # the name scope of a collective's loop apart from the steps

log = logging.getLogger("parallax")


def _op_name(key: int) -> str:
    """A collective's op named by its key, unique in the process: a worker's server runs every
    session's graph, and shares stateful kernels of one name between them (two graphs' ops of
    one name then ran with the first one's instance)."""
    return f"parallax_collective_{key}"


def communication_hint() -> str:
    """NCCL where this worker sees a GPU (TensorFlow runs NCCL where a group's devices are
    GPUs, and its ring elsewhere: docs/gpus.md), else the ring over gRPC."""
    return "nccl" if tf.config.list_physical_devices("GPU") else "ring"


class TensorFlowCollectives(Collectives):

    def __init__(self, cluster: Cluster, server: Callable[[], tf.compat.v1.train.Server]):
        super().__init__(cluster)
        self._server = server
        groups = [list(range(cluster.num_workers))] + cluster.machine_groups()
        self._group_keys: Dict[Tuple[int, ...], int] = {
            tuple(group): ALL_WORKERS + index for index, group in enumerate(groups)}
        self._keys = itertools.count(1)
        self._hint = communication_hint()
        self._apart = False  # a step's collectives in loops of their own (for_steps)

    def for_steps(self) -> "TensorFlowCollectives":
        if not self.cluster.has_servers:
            return self
        steps = copy.copy(self)  # the same count of keys
        steps._apart = True
        return steps

    def configure(self, config: tf.compat.v1.ConfigProto) -> tf.compat.v1.ConfigProto:
        config.experimental.collective_group_leader = LEADER
        return config

    def session(self, graph: tf.Graph, config=None) -> tf.compat.v1.Session:
        config = self.configure(config or tf.compat.v1.ConfigProto())
        config.device_filters[:] = [self.cluster.worker_device()]
        return tf.compat.v1.Session(self._server().target, graph=graph, config=config)

    def _group(self, group: Sequence[int] = None) -> Tuple[int, int]:
        members = tuple(group) if group is not None else tuple(range(self.cluster.num_workers))
        return len(members), self._group_keys[members]

    def _keyed(self, collective, value: tf.Tensor) -> tf.Tensor:
        key = self._key()
        return collective(value, key, _op_name(key))

    def _key(self, count: int = 1) -> int:
        key = next(self._keys)
        for _ in range(count - 1):
            next(self._keys)
        return key

    # -- ops ------------------------------------------------------------------------------
    def allreduce(self, tensor, average, group=None, name=None):
        tensor = tf.convert_to_tensor(tensor)
        if self._apart:
            return tf.identity(self._loop_apart(
                lambda inputs: [self._allreduce(inputs[0], average, group)], [tensor])[0],
                name=name)
        return self._allreduce(tensor, average, group, name)

    def _allreduce(self, tensor, average, group=None, name=None):
        size, group_key = self._group(group)
        reduce = lambda value, key, op_name: tf.raw_ops.CollectiveReduceV2(  # noqa: E731
            input=value, group_size=size, group_key=group_key, instance_key=key,
            ordering_token=[], merge_op="Add", final_op="Div" if average else "Id",
            communication_hint=self._hint, name=op_name)
        if tensor.shape.is_fully_defined():
            return tf.identity(self._keyed(reduce, tensor), name=name)
        flat = tf.reshape(tensor, [-1])
        reduced = self._padded(flat, tf.size(flat), reduce)
        return tf.reshape(reduced[:tf.size(flat)], tf.shape(tensor), name=name)

    def as_one(self, build, inputs):
        if not self._apart:
            return build(self, inputs)
        inside = copy.copy(self)  # the same count of keys, its collectives in the loop
        inside._apart = False
        return self._loop_apart(lambda taken: build(inside, taken), inputs)

    def allreduce_all(self, tensors: List[tf.Tensor], average: bool) -> List[tf.Tensor]:
        """Packed in buckets of one dtype, in the given order (gradients come in about the
        order backpropagation makes them, so a full bucket goes while the next fills)."""
        results: List[tf.Tensor] = [None] * len(tensors)
        buckets: Dict[tf.DType, List[int]] = {}
        sizes = [t.shape.num_elements() for t in tensors]

        def send(dtype):
            indices = buckets.pop(dtype)
            flat = tf.concat([tf.reshape(tensors[i], [-1]) for i in indices], 0)
            reduced = self.allreduce(flat, average)
            for i, part in zip(indices, tf.split(reduced, [sizes[i] for i in indices])):
                results[i] = tf.reshape(part, tensors[i].shape)

        for index, tensor in enumerate(tensors):
            if sizes[index] is None:
                results[index] = self.allreduce(tensor, average)
                continue
            bucket = buckets.setdefault(tensor.dtype, [])
            if bucket and (sum(sizes[i] for i in bucket) + sizes[index]) * \
                    tensor.dtype.size > BUCKET_BYTES:
                send(tensor.dtype)
                bucket = buckets.setdefault(tensor.dtype, [])
            bucket.append(index)
        for dtype in list(buckets):
            send(dtype)
        return results

    def allgather_slices(self, slices, average):
        """Each worker's count of rows first, then its rows padded to the largest count (the
        ops gather equal shapes only), the padding dropped after."""
        if self._apart:
            values, indices = self._loop_apart(
                lambda inputs: self._allgather(*inputs, average), [slices.values, slices.indices])
        else:
            values, indices = self._allgather(slices.values, slices.indices, average)
        return tf.IndexedSlices(values, indices, slices.dense_shape)

    def _allgather(self, values, indices, average):
        size, group_key = self._group()
        count = tf.shape(indices)[:1]

        def gather(value, key, op_name):
            return tf.raw_ops.CollectiveGatherV2(
                input=value, group_size=size, group_key=group_key, instance_key=key,
                ordering_token=[], communication_hint=self._hint, name=op_name)

        counts = self._keyed(gather, count)
        most = tf.reduce_max(counts)

        padded_values = self._padded(values, most, gather, pad_rows_of=count[0])
        padded_indices = self._padded(indices, most, gather, pad_rows_of=count[0])
        padded_rows = tf.shape(padded_indices)[0] // size
        keep = tf.reshape(tf.sequence_mask(counts, padded_rows), [-1])
        gathered_values = tf.boolean_mask(padded_values, keep)
        if average:
            gathered_values = gathered_values / tf.cast(size, values.dtype)
        return gathered_values, tf.boolean_mask(padded_indices, keep)

    def broadcast(self, tensor, name):
        size, group_key = self._group()
        tensor = tf.convert_to_tensor(tensor)

        def bcast(value, key, op_name):
            if self.cluster.is_chief:
                return tf.raw_ops.CollectiveBcastSendV2(
                    input=value, group_size=size, group_key=group_key, instance_key=key,
                    communication_hint=self._hint, name=op_name)
            return tf.raw_ops.CollectiveBcastRecvV2(
                group_size=size, group_key=group_key, instance_key=key, shape=tf.shape(value),
                T=value.dtype, communication_hint=self._hint, name=op_name)

        if tensor.shape.is_fully_defined():
            return tf.identity(self._keyed(bcast, tensor), name=name)
        flat = tf.reshape(tensor, [-1])
        sent = self._padded(flat, tf.size(flat), bcast)
        return tf.reshape(sent[:tf.size(flat)], tf.shape(tensor), name=name)

    def broadcast_variables(self, variables):
        # In the order of their names, whatever order the caller lists them in: keys go by
        # order.
        return tf.group(*[tf.compat.v1.assign(v, self.broadcast(v.read_value(), None))
                          for v in sorted(variables, key=lambda v: v.op.name)])

    def _padded(self, value: tf.Tensor, rows: tf.Tensor, collective, pad_rows_of=None
                ) -> tf.Tensor:
        """collective(value padded to a size of at least `rows` rows, its key): the sizes are
        2^(k/SIZES_PER_DOUBLING) rows, each size with a key of its own, the same on every
        worker where `rows` is (the largest count, gathered)."""
        base = self._key(_PADDED_KEYS)
        rows = tf.maximum(tf.cast(rows, tf.float64), 1.0)
        exponent = tf.math.ceil(SIZES_PER_DOUBLING * tf.math.log(rows) / math.log(2.0) - 1e-9)
        padded = tf.cast(tf.maximum(tf.math.ceil(2.0 ** (exponent / SIZES_PER_DOUBLING)), rows),
                         tf.int32)
        key = base + tf.cast(exponent, tf.int32)
        own = tf.shape(value)[0] if pad_rows_of is None else pad_rows_of
        padding = [[0, padded - own]] + [[0, 0]] * (value.shape.rank - 1)
        return collective(tf.pad(value, padding), key, _op_name(base))

    def _loop_apart(self, collective: Callable[[List[tf.Tensor]], List[tf.Tensor]],
                    inputs: List[tf.Tensor]) -> List[tf.Tensor]:
        """collective(inputs), run apart from the step: the step puts `inputs` in one queue and
        takes the results from another; a loop (_CollectiveRunner) takes them from the first,
        runs the collective and puts its results in the second."""
        key = self._key()  # the loop's step sequence, and its name
        with tf.name_scope(f"{APART_SCOPE}{key}"):
            incoming = tf.queue.FIFOQueue(1, [t.dtype for t in inputs], name="incoming")
            taken = _as_list(incoming.dequeue())
            for tensor, value in zip(taken, inputs):
                tensor.set_shape(value.shape)
            results = collective(taken)
            outgoing = tf.queue.FIFOQueue(1, [t.dtype for t in results], name="outgoing")
            loop = outgoing.enqueue(results)
            with tf.control_dependencies([incoming.enqueue(inputs)]):
                returned = _as_list(outgoing.dequeue())
            for tensor, result in zip(returned, results):
                tensor.set_shape(result.shape)
            cancel = tf.group(incoming.close(cancel_pending_enqueues=True),
                              outgoing.close(cancel_pending_enqueues=True))
        contracts.record_apart_loop(_CollectiveLoop(loop, cancel, key))
        return returned

    # -- membership: the servers run for the job's life, the groups are known from the start
    def join(self, stages: bool) -> None:
        pass

    def leave(self) -> None:
        pass


def _as_list(dequeued) -> List[tf.Tensor]:
    return list(dequeued) if isinstance(dequeued, (list, tuple)) else [dequeued]


class _CollectiveLoop:
    """The loop of one collective run apart from the steps (TensorFlowCollectives.for_steps),
    under a step sequence of its own (`graph_key`, the same on every worker): each worker runs
    each loop as often as its steps feed it, in the order they do. Its threads start with the
    runner's queue runners and stop with them (runtime/session.py: `create_threads`, as a
    QueueRunner's); a failure closes its queues, so that the step waiting for it fails too, and
    is logged."""

    def __init__(self, loop: tf.Operation, cancel: tf.Operation, graph_key: int):
        self.op, self._cancel = loop, cancel  # op: one turn of the loop
        self._options = tf.compat.v1.RunOptions()
        self._options.experimental.collective_graph_key = graph_key

    def create_threads(self, session, coord: tf.compat.v1.train.Coordinator
                       ) -> List[threading.Thread]:
        threads = [threading.Thread(target=self._run, args=(session, coord), daemon=True),
                   threading.Thread(target=self._cancel_on_stop, args=(session, coord),
                                    daemon=True)]
        for thread in threads:
            coord.register_thread(thread)
            thread.start()
        return threads

    def _run(self, session, coord) -> None:
        try:
            while not coord.should_stop():
                session.run(self.op, options=self._options)
        except (tf.errors.OutOfRangeError, tf.errors.CancelledError):
            pass  # its queues closed: the runner stopped
        except tf.errors.OpError as error:
            log.error("parallax: a collective run apart from the steps failed: %s", error)
            self._cancel_quietly(session)

    def _cancel_on_stop(self, session, coord) -> None:
        coord.wait_for_stop()
        self._cancel_quietly(session)

    def _cancel_quietly(self, session) -> None:
        try:
            session.run(self._cancel)
        except (tf.errors.OpError, RuntimeError):  # RuntimeError: the session closed
            pass
