"""`parallax.get_partitioner`: a variable stored in row shards, each its own variable (on a
parameter server, a shard each), whose number the cost model chooses when
`Config(search_partitions=True)`.

TensorFlow calls a partitioner with the variable's shape, not its name, so the calls are told
apart by their order in the graph, which the driver and every worker build alike: the driver
records which variable each call made (`partitioned_variables`), the plan (planning/planner.py)
gives each call its count, and a worker's call reads its count from its environment
(contracts.py).
"""
from __future__ import annotations

import dataclasses
from typing import List

import tensorflow as tf

from parallax import contracts, tf_private
from parallax.contracts import PartitionerCall
from parallax.errors import ParallaxError


@dataclasses.dataclass
class Partitioned:
    """A variable made by a partitioner of Parallax: its name and those of its shards."""
    name: str
    shards: List[str]
    min_partitions: int


def get_partitioner(min_partitions: int = 1):
    """A partitioner for `tf.compat.v1.get_variable(partitioner=...)` or a variable_scope: the
    variable is split along its first axis in `min_partitions` shards (at most one a row), or
    with `Config(search_partitions=True)` in as many as the cost model predicts fastest, from
    min_partitions to the number of machines. Outside a Parallax job, min_partitions.

    Each shard is drawn by the initializer on its own: initial values depend on the number of
    shards unless the initializer slices a full value by its `partition_info`. A checkpoint
    stores the variable whole (by its name and shape); it reads back into an unpartitioned
    variable with the same rows when lookups use partition_strategy='div'."""
    if not isinstance(min_partitions, int) or min_partitions < 1:
        raise ValueError(f"get_partitioner: min_partitions must be a whole number >= 1, got "
                         f"{min_partitions!r}")

    def partitioner(shape, dtype):  # pylint: disable=unused-argument
        graph = tf.compat.v1.get_default_graph()
        call = len(contracts.read_partitioner_calls(graph))
        count = contracts.read_partition_counts().get(call, min_partitions)
        contracts.record_partitioner_call(graph, PartitionerCall(
            len(graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)), min_partitions))
        return [max(1, min(count, tf.compat.dimension_value(shape[0])))] + [1] * (len(shape) - 1)

    return partitioner


def partitioned_variables(graph: tf.Graph) -> List[Partitioned]:
    """The variables of `graph` Parallax's partitioners made, by call."""
    variables = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    made = []
    for call in contracts.read_partitioner_calls(graph):
        first = variables[call.first_variable] if call.first_variable < len(variables) else None
        info = tf_private.save_slice_info(first) if first is not None else None
        if info is None:
            raise ParallaxError(
                "a partitioner of parallax.get_partitioner made no new variable in "
                "GLOBAL_VARIABLES: Parallax tells the variables of its calls by that list, and "
                "a call that reuses a partitioned variable (a variable_scope with reuse=True or "
                "AUTO_REUSE) makes none. Create the variable once and pass it where it is "
                "shared, or leave search_partitions off (and give it collections with "
                "GLOBAL_VARIABLES)")
        made.append(Partitioned(info.full_name, [
            v.op.name for v in variables
            if tf_private.save_slice_info(v) is not None
            and tf_private.save_slice_info(v).full_name == info.full_name], call.min_partitions))
    return made


def check_counts(graph: tf.Graph, partitions: List[list]) -> None:
    """In a worker: the partitioned variables are those the driver decided for, and have the
    counts it chose (a script that builds its graph otherwise in a worker would train another
    model than the one measured)."""
    made = partitioned_variables(graph)
    expected = {call: (name, count) for call, name, count in partitions}
    for call, variable in enumerate(made):
        name, count = expected.get(call, (variable.name, len(variable.shards)))
        if (name, count) != (variable.name, len(variable.shards)):
            raise ParallaxError(
                f"parallax.get_partitioner call {call} made {variable.name!r} in "
                f"{len(variable.shards)} shards in this worker, but {name!r} in {count} in the "
                "driver: the script must build the same graph in every process")
