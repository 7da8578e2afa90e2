"""TensorFlow's gRPC server of one task of the job: a parameter server (server.py) or a worker
(api.py)."""
from typing import Optional

import tensorflow as tf

from parallax.cluster import Cluster
from parallax.errors import ParallaxError


def start_server(cluster: Cluster, job: str, index: int,
                 config: Optional[tf.compat.v1.ConfigProto] = None) -> tf.compat.v1.train.Server:
    """The gRPC server of task `index` of `job` ("ps" or "worker"); a port another process
    holds is named, where TensorFlow only says that it could not start."""
    address = (cluster.servers if job == "ps" else cluster.workers)[index]
    jobs = {"ps": cluster.servers, "worker": cluster.workers}
    try:
        return tf.compat.v1.train.Server(
            tf.train.ClusterSpec({name: tasks for name, tasks in jobs.items() if tasks}),
            job_name=job, task_index=index, config=config)
    except tf.errors.UnknownError as error:
        if "Could not start gRPC server" not in str(error):
            raise
        raise ParallaxError(
            f"{job} {index} cannot listen on {address}: another process holds the port "
            "(with Config.base_port set, choose ports no other program uses)") from None
