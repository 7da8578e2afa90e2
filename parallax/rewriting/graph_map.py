"""Finding the user's tensors and ops in the rewritten copy a worker runs, and bringing ops the
user builds after get_runner (an initializer, a Saver, an evaluation) into it, rewritten as
the split of variables rewrote the rest."""
from __future__ import annotations

from typing import Dict, Optional, Union

import tensorflow as tf

from parallax import tf_private
from parallax.graph_copy import within_task
from parallax.rewriting import split_variables
from parallax.rewriting.passes import dynamic_tables

Element = Union[tf.Tensor, tf.Operation]


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
            if not tf_private.has_function(self.copy, f.signature.name))
        graph_def.library.gradient.extend(
            g for g in user_def.library.gradient
            if not tf_private.has_function(self.copy, g.function_name))
        for node in new:
            copied = graph_def.node.add()
            copied.CopyFrom(node)
            copied.device = within_task(node.device)
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
                tf_private.add_control_inputs(op, controls[node.name])
        for name, targets in colocations.items():
            groups = [f"loc:@{self._op(target).name}".encode() for target in targets]
            attr = tf.compat.v1.AttrValue(list=tf.compat.v1.AttrValue.ListValue(s=groups))
            tf_private.set_attr(self._ops[name], "_class", attr)
        split_variables.rewrite_uses(self.copy)  # new ops on a split variable (a Saver's)
        dynamic_tables.rewrite_uses(self.copy)  # and on a dynamic embedding's keys
