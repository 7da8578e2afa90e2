"""A parameter server: TensorFlow's own gRPC server for one machine's task of job 'ps'.
The driver starts one per machine (`python -m parallax.runtime.server`) and stops it at the end."""
from parallax import contracts
from parallax.runtime.grpc_server import start_server
from runner.heartbeat import Heartbeat


def main():
    heartbeat = Heartbeat.from_env()  # pylint: disable=unused-variable  (beats until exit)
    index = contracts.read_server_index()
    cluster = contracts.read_cluster()
    server = start_server(cluster, "ps", index)
    print(f"parameter server {index} serving at {cluster.servers[index]}", flush=True)
    server.join()


if __name__ == "__main__":
    main()
