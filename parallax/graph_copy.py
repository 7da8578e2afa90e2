"""The user's graph stays the single-device graph they built: the driver's probe runs a copy of
it, and a worker's passes rewrite a copy (rewriting/graph_map.py finds the user's tensors and
ops in it by name).

Leaving the user's graph alone is what makes a FileWriter, a Saver's meta graph and
export_meta_graph show and store the single-device graph, which loads without Horovod.
"""
from __future__ import annotations

import tensorflow as tf

from parallax import tf_private


def copy_graph(graph: tf.Graph) -> tf.Graph:
    """A new graph with the same ops (names, devices within a task) and collections, through a
    MetaGraphDef: variables, queue runners, savers and control-flow contexts come back as
    Python objects."""
    meta_graph = tf.compat.v1.train.export_meta_graph(graph=graph, clear_devices=False)
    _drop_function_ops_from_collections(meta_graph)
    for node in meta_graph.graph_def.node:
        node.device = within_task(node.device)
    copy = tf.Graph()
    # import_meta_graph would also add a Saver of every variable to the copy: its import alone.
    tf_private.import_scoped_meta_graph(meta_graph, graph=copy, clear_devices=False)
    copy.seed = graph.seed
    # Not in a MetaGraphDef: what TensorFlow refuses to fetch or feed (an op inside a v1
    # tf.cond's branch), which a run of the copy must refuse too.
    for op in graph.get_operations():
        if not graph.is_fetchable(op):
            copy.prevent_fetching(copy.get_operation_by_name(op.name))
        for tensor in op.outputs:
            if not graph.is_feedable(tensor):
                copy.prevent_feeding(copy.get_tensor_by_name(tensor.name))
    return copy


def within_task(device: str) -> str:
    """A user's device without its job, replica and task: which process runs an op is
    Parallax's to say. A graph written for TensorFlow's parameter servers pins its variables to
    '/job:ps' (replica_device_setter), which is the job of Parallax's servers too: a variable
    the plan replicates would live there, one for every worker to update. The device within the
    task ('/gpu:0') stays."""
    spec = tf.DeviceSpec.from_string(device)
    if spec.job is None and spec.replica is None and spec.task is None:
        return device
    return spec.replace(job=None, replica=None, task=None).to_string()


def _drop_function_ops_from_collections(meta_graph) -> None:
    """An op built inside a function (a tf.cond branch under control flow v2, e.g. the
    optimizer's op that apply_gradients puts in the train_op collection) is listed in the
    outer graph's collections but is not one of its nodes, so TensorFlow cannot import the
    collection. It stays in the function, which the copy has; only the listing goes."""
    nodes = {node.name for node in meta_graph.graph_def.node}
    for collection in meta_graph.collection_def.values():
        if collection.WhichOneof("kind") != "node_list":
            continue
        kept = [name for name in collection.node_list.value
                if name.lstrip("^").split(":")[0] in nodes]
        del collection.node_list.value[:]
        collection.node_list.value.extend(kept)
