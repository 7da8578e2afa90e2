"""Parallax: automatic data-parallel training of a TensorFlow graph written for one device.

    import parallax            # before building the graph: gradients are recorded from here on
    ...build the graph, e.g. with tf.compat.v1.train.AdamOptimizer(...).minimize(loss)...
    runner = parallax.get_runner(graph, "localhost:0,1")
    runner.run(train_op)
"""
from parallax import tf_logs

tf_logs.quiet_start()  # before TensorFlow loads: its start-up lines are dropped (PARALLAX_TF_LOGS)

from parallax import capture  # noqa: E402

capture.install()  # gradients built from here on are recorded

from parallax.api import (MonitoredTrainingSession, get_runner,  # noqa: E402
                          num_shards_and_shard_id, num_workers, shard)  # (after the capture hook)
from parallax.config import CheckpointConfig, Config, ProfileConfig, PSConfig  # noqa: E402
from parallax.embeddings import DynamicEmbedding, dynamic_embedding  # noqa: E402
from parallax.errors import ConfigError, ParallaxError  # noqa: E402
from parallax.partitioner import get_partitioner  # noqa: E402

__all__ = ["get_runner", "MonitoredTrainingSession", "shard", "num_workers",
           "num_shards_and_shard_id", "get_partitioner", "Config", "PSConfig", "CheckpointConfig",
           "ProfileConfig", "ParallaxError", "ConfigError", "dynamic_embedding", "DynamicEmbedding"]
