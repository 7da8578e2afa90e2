"""The classic mistake caught: a job whose workers all read the same input (nobody sharded the
dataset) trains on N copies of one batch, and nothing fails. At its first training step each
worker reports a digest of every data input of the step — what its tf.data iterators and input
queues gave, and what it fed, but not a setting (a fed rate, is_training) — and the driver says
so once when every worker's are equal (`warning`, runner.control_server.identical_digests).

Its subtler form: each worker shuffles the whole data its own way (an unseeded np.random, a
dataset shuffled but not sharded), so the inputs differ but the workers' batches share rows.
Each worker also reports hashes of its inputs' rows — the same sample of them on every worker
(those of the smallest hashes), as `rows J NAME` digests — and the driver says so when two
workers' batches have rows in common (`shared_rows`, `shared_rows_warning`)."""
from __future__ import annotations

import collections
import hashlib
from typing import Collection, Dict, Iterable, List

import numpy as np
import tensorflow as tf

from parallax.vocabulary import (INPUT_OP_TYPES, ITERATOR_GET_NEXT_OPS, downstream_ops,
                                 is_setting, reached)
from runner.beat_message import MAX_DIGESTS

SHARD_ID_NAME = "parallax_shard_id"  # parallax.num_shards_and_shard_id()'s id constant
ROWS = "rows "  # the names of the digests of an input's rows: "rows J NAME"
# 48 bits of a row's digest: distinct rows of a few workers' batches do not collide.
_ROW_HASH_CHARS = 12
_ROW_HASHES_PER_DIGEST = 5  # 60 characters: a digest is at most 64 (runner.beat_message)
_ROW_DIGESTS_PER_INPUT = 16  # 80 rows of each input compared: a beat stays small


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
    """Digests of the step's data inputs (name_of): not its random draws, which differ; and
    of their rows, as many as MAX_DIGESTS leaves room for."""
    data = {name: value for name, value in named.items() if not name.startswith("random ")}
    found = digests(data)
    found.update(_row_digests(data, MAX_DIGESTS - len(found)))
    return found


def _row_digests(data: Dict[str, object], room: int) -> Dict[str, str]:
    """The hashes of each input's rows, the smallest first, in at most `room` digests: on
    every worker the same rows are the sampled ones. An input whose batch repeats a row has
    none: its data has repeated rows (labels, frequent ids), which any two workers share."""
    hashed = {}
    for name, value in data.items():
        array = np.asarray(value)
        if array.ndim and len(array) > 1:
            hashes = {_digest(row)[:_ROW_HASH_CHARS] for row in array}
            if len(hashes) == len(array):
                hashed[name] = sorted(hashes)
    found = {}
    for order, (name, hashes) in enumerate(hashed.items()):
        share = min(_ROW_DIGESTS_PER_INPUT, max(room, 0) // len(hashed)
                    + (order < max(room, 0) % len(hashed)))
        for index in range(min(share, -(-len(hashes) // _ROW_HASHES_PER_DIGEST))):
            start = index * _ROW_HASHES_PER_DIGEST
            found[f"{ROWS}{index} {name}"] = "".join(
                hashes[start:start + _ROW_HASHES_PER_DIGEST])
    return found


def shared_rows(reported: List[Dict[str, str]]) -> Dict[str, int]:
    """Of every worker's data_digests, the inputs of which rows were in two workers' batches or
    more: input name (name_of) -> how many of the rows compared. Not an input equal on every
    worker: that one is `warning`'s where every input is; beside inputs that differ, it is
    taken as meant (a table fed each step), as there."""
    rows = [collections.defaultdict(set) for _ in reported]
    for worker, digested in zip(rows, reported):
        for name, hashes in digested.items():
            if name.startswith(ROWS):
                worker[name[len(ROWS):].partition(" ")[2]].update(
                    hashes[i:i + _ROW_HASH_CHARS] for i in range(0, len(hashes),
                                                                  _ROW_HASH_CHARS))
    found = {}
    for name in set(rows[0]).intersection(*rows[1:]):
        if any(digested.get(name) != reported[0].get(name) for digested in reported):
            seen = collections.Counter(h for worker in rows for h in worker[name])
            if shared := sum(count > 1 for count in seen.values()):
                found[name] = shared
    return dict(sorted(found.items()))


def warning(names: List[str], workers: int) -> str:
    """What the driver says when the `workers` read the same input at their first step; the
    digests' `names` (name_of) are shown by op."""
    shown = _shown_by_op(name for name in names if not name.startswith(ROWS))
    return (f"every worker read the same input at its first training step ({shown}: equal on "
            f"all {workers} workers). The job trains on {workers} copies of one batch, not on "
            f"{workers} different batches as one device would on the combined batch. Shard "
            "the input: dataset = parallax.shard(dataset) for tf.data; num_shards, shard_id = "
            "parallax.num_shards_and_shard_id() to pick each worker's files or rows in the "
            "graph; with feed_dict, feed each worker its own rows (runner.worker_id of "
            "runner.num_workers). Config(warn_unsharded_input=False) "
            "silences this for a job that means it")


def shared_rows_warning(shared: Dict[str, int], workers: int) -> str:
    """What the driver says when the `workers`' first training batches had rows in common
    (`shared`, shared_rows)."""
    counts = ", ".join(f"{_shown_by_op([name])}: {count}" for name, count in shared.items())
    return (f"the first training batches of the {workers} workers have rows in common "
            f"(rows also in another worker's batch, of up to "
            f"{_ROW_DIGESTS_PER_INPUT * _ROW_HASHES_PER_DIGEST} compared per input: {counts}). "
            "Each worker draws its batches from the same data its own way (an unseeded "
            "np.random shuffle in every worker, a dataset shuffled but not sharded), so the "
            "workers train on overlapping rows where one device would see each row once per "
            "epoch. Shuffle with a seed every worker shares, then take each worker's rows "
            "(rows[runner.worker_id::runner.num_workers]), or dataset = parallax.shard(dataset) "
            "before its shuffle. Config(warn_unsharded_input=False) silences this for a job "
            "that means it")


def _shown_by_op(names: Iterable[str]) -> str:
    """Digests' names (name_of) by op, the first three."""
    ops = list(dict.fromkeys(
        f"{kind} {tensor.rsplit(':', 1)[0]!r}" for kind, _, tensor in
        (name.partition(" ") for name in names)))
    return ", ".join(ops[:3]) + (f" and {len(ops) - 3} more" if len(ops) > 3 else "")


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
