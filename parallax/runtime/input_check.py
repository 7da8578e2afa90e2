"""The classic mistake caught: a job whose workers all read the same input (nobody sharded the
dataset) trains on N copies of one batch, and nothing fails. At its first training step each
worker reports a digest of every data input of the step — what its tf.data iterators and input
queues gave, and what it fed, but not a setting (a fed rate, is_training) — and the driver says
so once when every worker's are equal (`warning`, runner.control.identical_digests)."""
from __future__ import annotations

import hashlib
from typing import Collection, Dict, Iterable, List

import numpy as np
import tensorflow as tf

from parallax.vocabulary import (INPUT_OP_TYPES, ITERATOR_GET_NEXT_OPS, downstream_ops,
                                 is_setting, reached)

SHARD_ID_NAME = "parallax_shard_id"  # parallax.num_shards_and_shard_id()'s id constant
def step_inputs(ops: Iterable[tf.Operation], fed: Collection[tf.Tensor],
                user_ops: Collection[str]) -> List[tf.Tensor]:
    """The outputs of the input ops (of the user's graph, named in `user_ops`) that a run of
    `ops` runs."""
    return sorted((t for op in reached(ops, fed)
                   if op.type in INPUT_OP_TYPES and op.name in user_ops for t in op.outputs),
                  key=lambda t: t.name)


def taken_rows(ops: Iterable[tf.Operation], fed: Collection[tf.Tensor],
               inputs: Collection[tf.Tensor]) -> List[tf.Tensor]:
    """Where a run of `ops` takes this worker's rows of what it read, by the worker's id
    (parallax.num_shards_and_shard_id() in the graph): the first ops that both the inputs and
    the id reach. Workers that read one batch and each take their rows so read alike, and
    differ here."""
    runs = reached(ops, fed)
    shard_ids = [op for op in runs if op.type == "Const" and op.name.split("/")[-1].startswith(
        SHARD_ID_NAME)]
    if not shard_ids:
        return []
    by_id, by_input = (downstream_ops(start, inside=runs)
                       for start in (shard_ids, {t.op for t in inputs}))
    both = by_id & by_input
    return sorted((t for op in both if not any(i.op in both for i in op.inputs)
                   for t in op.outputs), key=lambda t: t.name)


def fed_data(feeds: Dict[tf.Tensor, object]) -> Dict[tf.Tensor, object]:
    """The fed values that are data, not settings (a rate, is_training: one value)."""
    return {tensor: value for tensor, value in feeds.items()
            if not (is_setting(tensor.op) or np.ndim(value) == 0)}


def digests(values: Dict[str, object]) -> Dict[str, str]:
    """name -> a digest of the value (its dtype, shape and bytes)."""
    return {name: _digest(value) for name, value in values.items()}


def _digest(value) -> str:
    array = np.asarray(value)
    digest = hashlib.blake2b(f"{array.dtype}{array.shape}".encode(), digest_size=16)
    if array.dtype == object:  # strings
        for item in array.ravel():
            digest.update(item if isinstance(item, bytes) else str(item).encode())
            digest.update(b"\0")
    else:
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def name_of(tensor: tf.Tensor, fed: bool, taken: bool = False) -> str:
    """How a value of the step's input is named: its kind, then the tensor (`taken`: one of
    taken_rows)."""
    op_type = tensor.op.type
    kind = ("feed" if fed else "taken" if taken else "tf.data"
            if op_type in ITERATOR_GET_NEXT_OPS else "queue" if op_type in INPUT_OP_TYPES
            else "random")
    return f"{kind} {tensor.name}"


def data_digests(named: Dict[str, object]) -> Dict[str, str]:
    """Digests of the step's data inputs (name_of): not its random draws, which differ."""
    return digests({name: value for name, value in named.items()
                    if not name.startswith("random ")})


def warning(names: List[str], workers: int) -> str:
    """What the driver says when the `workers` read the same input at their first step; the
    digests' `names` (name_of) are shown by op."""
    ops = list(dict.fromkeys(
        f"{kind} {tensor.rsplit(':', 1)[0]!r}" for kind, _, tensor in
        (name.partition(" ") for name in names)))
    shown = ", ".join(ops[:3]) + (f" and {len(ops) - 3} more" if len(ops) > 3 else "")
    return (f"every worker read the same input at its first training step ({shown}: equal on "
            f"all {workers} workers). The job trains on {workers} copies of one batch, not on "
            f"{workers} different batches as one device would on the combined batch. Shard "
            "the input: dataset = parallax.shard(dataset) for tf.data; num_shards, shard_id = "
            "parallax.num_shards_and_shard_id() to pick each worker's files or rows in the "
            "graph; with feed_dict, feed each worker its own rows (runner.worker_id of "
            "runner.num_workers). Config(warn_unsharded_input=False) "
            "silences this for a job that means it")


# Datasets whose elements are their input's elements, component for component: a padded_batch
# before them is what pads an iterator's output.
_SAME_COMPONENTS = frozenset({
    "PrefetchDataset", "ShardDataset", "RepeatDataset", "TakeDataset", "SkipDataset",
    "CacheDataset", "CacheDatasetV2", "ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3",
    "ShuffleAndRepeatDataset", "ShuffleAndRepeatDatasetV2", "OptionsDataset", "ModelDataset",
    "OptimizeDataset", "OptimizeDatasetV2", "MaxIntraOpParallelismDataset",
    "PrivateThreadPoolDataset", "AssertCardinalityDataset", "FilterDataset"})
_PADDED_BATCHES = frozenset({"PaddedBatchDataset", "PaddedBatchDatasetV2"})


def padding_value(tensor: tf.Tensor):
    """The value the tf.data `padded_batch` behind an iterator's output `tensor` pads with, and
    that op's name; (None, None) where no padded_batch gives it, or where it cannot be told
    (several datasets, a padding value computed at run time, a map after the batch)."""
    if tensor.op.type not in ITERATOR_GET_NEXT_OPS:
        return None, None
    definition = tensor.graph.as_graph_def()
    nodes = {node.name: node for node in definition.node}
    iterator = nodes[_source(nodes[tensor.op.name].input[0])]
    if iterator.op == "OneShotIterator":  # the dataset is made by a function
        factory = iterator.attr["dataset_factory"].func.name
        function = next(f for f in definition.library.function if f.signature.name == factory)
        nodes = {node.name: node for node in function.node_def}
        datasets = [_source(value) for value in function.ret.values()]
    else:
        datasets = [_source(node.input[0]) for node in nodes.values()
                    if node.op == "MakeIterator" and _source(node.input[1]) == iterator.name]
    if len(datasets) != 1:
        return None, None
    node = nodes.get(datasets[0])
    while node is not None and node.op in _SAME_COMPONENTS:
        node = nodes.get(_source(node.input[0]))
    if node is None or node.op not in _PADDED_BATCHES:
        return None, None
    value = nodes.get(_source(node.input[2 + node.attr["N"].i + tensor.value_index]))
    while value is not None and value.op == "Identity":
        value = nodes.get(_source(value.input[0]))
    if value is None or value.op != "Const":
        return None, None
    return tf.make_ndarray(value.attr["value"].tensor), node.name


def _source(name: str) -> str:
    """The node an input of a NodeDef names ("node:0" in a graph, "node:handle:0" in a
    function's body)."""
    return name.lstrip("^").split(":")[0]
