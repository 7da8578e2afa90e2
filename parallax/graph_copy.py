"""The user's graph stays the single-device graph they built: the passes rewrite a copy, and the
runner finds the user's tensors and ops in that copy by name. Ops the user builds after
get_runner (an initializer, a Saver, an evaluation) are copied over when first run.

Leaving the user's graph alone is what makes a FileWriter, a Saver's meta graph and
export_meta_graph show and store the single-device graph, which loads without Horovod.
"""
from __future__ import annotations

from typing import Dict, Optional, Union

import tensorflow as tf
# import_meta_graph would also add a Saver of every variable to the copy: this is its import alone.
from tensorflow.python.framework.meta_graph import import_scoped_meta_graph

from parallax.passes import split_variables

Element = Union[tf.Tensor, tf.Operation]


def copy_graph(graph: tf.Graph) -> tf.Graph:
    """A new graph with the same ops (names, devices within a task) and collections, through a
    MetaGraphDef: variables, queue runners, savers and control-flow contexts come back as
    Python objects."""
    meta_graph = tf.compat.v1.train.export_meta_graph(graph=graph, clear_devices=False)
    _drop_function_ops_from_collections(meta_graph)
    for node in meta_graph.graph_def.node:
        node.device = _within_task(node.device)
    copy = tf.Graph()
    import_scoped_meta_graph(meta_graph, graph=copy, clear_devices=False)
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


def _within_task(device: str) -> str:
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


class GraphMap:
    """Finds an element of the user's graph in the copy a worker runs (`copy`, rewritten by
    the passes after copy_graph). The passes keep every op of the user's graph under its name;
    an op the user built later is imported into the copy with what it depends on mapped to
    the copy's ops (TensorFlow renames it if a pass took its name: the map remembers)."""

    def __init__(self, user: tf.Graph, copy: tf.Graph):
        self.user = user
        self.copy = copy
        self._ops: Dict[str, tf.Operation] = {}  # user's op name -> copied op, built later
        self._known = {op.name for op in user.get_operations()}  # in the copy by their name

    def find(self, element: Element, aggregated: Optional[Dict[str, str]] = None) -> Element:
        """`aggregated`, for a fetch: see split_variables.replacement."""
        if element.graph is self.copy:
            return element
        return self._element(element.name, aggregated)

    def _element(self, name: str, aggregated: Optional[Dict[str, str]] = None) -> Element:
        """The copy's op or tensor of this name: what stands for it where a variable was
        split (split_variables.replacement; an op built later is imported, and so rewritten,
        first)."""
        op_name, _, index = name.partition(":")
        op = self._op(op_name)
        element = op.outputs[int(index)] if index else op
        stand_in = split_variables.replacement(self.copy, element.name, aggregated)
        return element if stand_in is None else stand_in

    def _op(self, name: str) -> tf.Operation:
        if name in self._known:
            return self.copy.get_operation_by_name(name)
        if name not in self._ops:
            self._copy_new_ops()
        return self._ops[name]

    def _copy_new_ops(self) -> None:
        """Import every op of the user's graph the copy has not seen yet, at once. Their inputs
        from ops it has are mapped to those; control inputs are added after the import, as
        TensorFlow's import can only map those to ops with outputs, and so is colocation with
        an op the copy has (an embedding lookup's with its table), which the import refuses."""
        user_def = self.user.as_graph_def()
        new = [node for node in user_def.node
               if node.name not in self._known and node.name not in self._ops]
        names = {node.name for node in new}
        input_map, controls, colocations = {}, {}, {}
        graph_def = tf.compat.v1.GraphDef(versions=user_def.versions)
        # Only functions the copy lacks: TensorFlow refuses to import one under a name the copy
        # has (a tf.cond's branch, as the copy's import of it differs in its attributes).
        graph_def.library.function.extend(
            f for f in user_def.library.function
            if not self.copy._is_function(f.signature.name))  # pylint: disable=protected-access
        graph_def.library.gradient.extend(
            g for g in user_def.library.gradient
            if not self.copy._is_function(g.function_name))  # pylint: disable=protected-access
        for node in new:
            copied = graph_def.node.add()
            copied.CopyFrom(node)
            copied.device = _within_task(node.device)
            del copied.input[:]
            for source in node.input:
                producer = source.lstrip("^").split(":")[0]
                if producer in names:
                    copied.input.append(source)
                elif source.startswith("^"):
                    controls.setdefault(node.name, []).append(self._element(producer))
                else:
                    copied.input.append(source)
                    tensor = source if ":" in source else source + ":0"
                    input_map[tensor] = self._element(tensor)
            if "_class" not in copied.attr:  # reading a missing key of the map would add it
                continue
            targets = [group.decode()[len("loc:@"):] for group in copied.attr["_class"].list.s]
            if any(target not in names for target in targets):
                colocations[node.name] = targets
                del copied.attr["_class"]
        with self.copy.as_default():
            imported = tf.graph_util.import_graph_def(
                graph_def, input_map=input_map, return_elements=[n.name for n in new], name="")
        for node, op in zip(new, imported):
            self._ops[node.name] = op
            if node.name in controls:
                op._add_control_inputs(controls[node.name])  # pylint: disable=protected-access
        for name, targets in colocations.items():
            groups = [f"loc:@{self._op(target).name}".encode() for target in targets]
            attr = tf.compat.v1.AttrValue(list=tf.compat.v1.AttrValue.ListValue(s=groups))
            self._ops[name]._set_attr("_class", attr)  # pylint: disable=protected-access
        split_variables.rewrite_uses(self.copy)  # new ops on a split variable (a Saver's)
