"""The two calls a user makes: `shard(dataset)` and `get_runner(graph, resources, config)`."""
from __future__ import annotations

import logging
from typing import Optional

import tensorflow as tf

from parallax import launch
from parallax.analysis import analyze
from parallax.config import Config
from parallax.errors import ParallaxError
from parallax.passes import transform
from parallax.passes.allreduce import BROADCAST_COLLECTION
from parallax.plan import describe, make_plan
from parallax.session import ParallaxRunner

log = logging.getLogger("parallax")


def shard(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """This worker's disjoint share of `dataset`: every num_workers-th element from its id."""
    num_workers, worker_id = launch.worker_count_and_id()
    return dataset if num_workers == 1 else dataset.shard(num_workers, worker_id)


def get_runner(graph: tf.Graph, resources: str, config: Optional[Config] = None):
    """Train `graph` (built for one device) data-parallel on `resources`.

    In the process the user started (the driver) this launches one worker per slot, each
    re-running the same script, waits for them and exits with their status: it does not return.
    In a worker it returns a ParallaxRunner whose `run` takes the original graph's fetches.
    """
    config = config or Config()
    if not isinstance(graph, tf.Graph):
        raise ParallaxError(f"get_runner needs a tf.Graph, got {type(graph).__name__}")
    analysis = analyze(graph)  # in the driver too, so a bad graph fails before any launch
    if launch.role() == "driver":
        launch.run_driver(resources, config)
    return _start_worker(graph, analysis, config)


def _start_worker(graph, analysis, config) -> ParallaxRunner:
    import horovod.tensorflow as hvd  # only workers join the Horovod job

    hvd.init()
    plan = make_plan(analysis, config, hvd.size())
    graph = transform(graph, plan)
    with graph.as_default():
        initialize = tf.group(tf.compat.v1.global_variables_initializer(),
                              tf.compat.v1.local_variables_initializer(),
                              tf.compat.v1.tables_initializer())
    sess_config = config.sess_config or tf.compat.v1.ConfigProto(allow_soft_placement=True)
    session = tf.compat.v1.Session(graph=graph, config=sess_config)
    session.run(initialize)
    session.run(graph.get_collection(BROADCAST_COLLECTION))
    description = describe(plan)
    if hvd.rank() == 0:
        log.warning("%s", description)
    return ParallaxRunner(graph, session, hvd.size(), hvd.rank(), description)
