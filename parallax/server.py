"""A parameter server: TensorFlow's own gRPC server for one machine's task of job 'ps'.
The driver starts one per machine (`python -m parallax.server`) and stops it at the end."""
import os

import tensorflow as tf

from parallax.cluster import SERVER_INDEX_ENV, Cluster


def main():
    cluster = Cluster.from_env()
    index = int(os.environ[SERVER_INDEX_ENV])
    server = tf.compat.v1.train.Server(
        tf.train.ClusterSpec({"ps": cluster.servers, "worker": cluster.workers}),
        job_name="ps", task_index=index)
    print(f"parameter server {index} serving at {cluster.servers[index]}", flush=True)
    server.join()


if __name__ == "__main__":
    main()
