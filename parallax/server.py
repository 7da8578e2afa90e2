"""A parameter server: TensorFlow's own gRPC server for one machine's task of job 'ps'.
The driver starts one per machine (`python -m parallax.server`) and stops it at the end."""
import os

from parallax.cluster import SERVER_INDEX_ENV, Cluster
from parallax.grpc_server import start_server


def main():
    index = int(os.environ[SERVER_INDEX_ENV])
    cluster = Cluster.from_env()
    server = start_server(cluster, "ps", index)
    print(f"parameter server {index} serving at {cluster.servers[index]}", flush=True)
    server.join()


if __name__ == "__main__":
    main()
