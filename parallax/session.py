"""Session wrapper: runs the transformed graph, taking the user's fetches and feeds as they
were written against the original graph (objects or names, nested as Session.run takes them)."""
from __future__ import annotations

import json

import tensorflow as tf

from parallax.errors import ParallaxError
from parallax.passes.rewire import read_aggregated
from parallax.passes.sync import STEP_COLLECTION


class ParallaxRunner:
    """What `parallax.get_runner` returns in each worker process."""

    def __init__(self, graph: tf.Graph, session: tf.compat.v1.Session, num_workers: int,
                 worker_id: int, description: str, checkpointer=None):
        self.graph = graph
        self._checkpointer = checkpointer
        self.session = session
        self.num_workers = num_workers
        self.worker_id = worker_id
        self._description = description
        self._aggregated = read_aggregated(graph)
        # A fetched server-side update is the whole step: on the chief its updates and the
        # release of the other workers, on the others the wait for that release.
        self._step_ops = {pair["op"]: graph.get_operation_by_name(pair["step_done"])
                          for pair in map(json.loads, graph.get_collection(STEP_COLLECTION))}

    @property
    def is_chief(self) -> bool:
        return self.worker_id == 0

    def describe(self) -> str:
        """One line per variable: kind, shape, bytes, where it lives, how it is synchronized."""
        return self._description

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        mapped = tf.nest.map_structure(self._map_fetch, fetches)
        feeds = None if feed_dict is None else {
            self._element(key, "feed key"): value for key, value in feed_dict.items()}
        result = self.session.run(mapped, feed_dict=feeds, options=options,
                                  run_metadata=run_metadata)
        if self._checkpointer is not None:
            self._checkpointer.after_run(self.session)
        return result

    def close(self) -> None:
        """Save a last checkpoint (when configured) and close the session."""
        if self._checkpointer is not None:
            self._checkpointer.save(self.session, self._checkpointer.current_step(self.session))
        self.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _map_fetch(self, fetch):
        element = self._element(fetch, "fetch")
        if isinstance(element, tf.IndexedSlices):
            return tf.IndexedSlices(self._aggregate(element.values),
                                    self._aggregate(element.indices), element.dense_shape)
        if isinstance(element, tf.Tensor):
            return self._aggregate(element)
        if isinstance(element, tf.Operation):
            return self._step_ops.get(element.name, element)
        return element

    def _aggregate(self, tensor: tf.Tensor) -> tf.Tensor:
        """A fetched gradient is the aggregated one, as training on one device would give."""
        name = self._aggregated.get(tensor.name)
        return tensor if name is None else self.graph.get_tensor_by_name(name)

    def _element(self, item, what: str):
        if isinstance(item, str):
            try:
                return self.graph.as_graph_element(item)
            except (KeyError, ValueError, TypeError) as error:
                raise ParallaxError(
                    f"{what} {item!r} is not in the graph given to get_runner: {error}. "
                    "Use a tensor or op of that graph, or its name such as 'loss:0'.") from None
        graph = getattr(item, "graph", None)
        if graph is None and isinstance(item, tf.IndexedSlices):
            graph = item.values.graph
        if graph is not self.graph:
            raise ParallaxError(
                f"{what} {item!r} does not belong to the graph given to get_runner; build "
                "fetches and feeds in that graph (or pass their names).")
        return item
