"""A short probe of TensorFlow's gRPC transport between two machines, as the parameter-server
path uses it: a worker's pulls and pushes of a small and of a large tensor from and to a
server's variable, and a push of rows into a table (what a server aggregates and applies),
each timed on the wall and in both processes' CPU. The cost model prices what the link probe
(runner/link_probe.py) cannot see: the cost of each message beyond the link's latency, and the
CPU each message, byte and row takes at both ends, which on shared cores is the step's bound.

    python -m parallax.planning.transport_probe serve HOST
        a server (TensorFlow's, job "ps") on HOST; prints its port; then, for each line "mark"
        on its input, its process's CPU seconds so far; it ends when its input does
    python -m parallax.planning.transport_probe measure HOST SERVER
        the worker on HOST, of the server's port given on its first input line (both start
        TensorFlow at once); before each phase it prints "ready NAME" and waits for a line,
        after it "done NAME WALL CPU" (medians and means a run, seconds), then "end"

`probe(client, server, shell)` runs both (over ssh where they are not this machine), takes
the server's CPU around each phase, and returns a Transport. TensorFlow's server listens on
every interface (docs/security.md) for the probe's few seconds; it serves one variable.
"""
from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Dict, List, Tuple

from parallax.planning.cost import Transport
from runner.resources import is_local
from runner.ssh import environment_line

RUNS, WARM_RUNS = 20, 3
SMALL, LARGE = 1, 1 << 20  # float32 elements of the small and the large tensor
ROWS, ROW_WIDTH, TABLE_ROWS = 1024, 64, 65536  # the rows a push adds into a table
TIMEOUT_SECONDS = 120
PHASES = ("local", "pull", "push", "pull-large", "push-large", "rows")


def serve(host: str) -> None:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    port = _free_port(host)
    tf.compat.v1.train.Server(tf.train.ClusterSpec({"ps": [f"{host}:{port}"]}),
                              job_name="ps", task_index=0)
    print(port, flush=True)
    threading.Timer(TIMEOUT_SECONDS, lambda: _exit(2)).start()
    for line in sys.stdin:
        if line.strip() == "mark":
            print(time.process_time(), flush=True)
    _exit(0)


def measure(host: str, server: str) -> None:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    tf.compat.v1.disable_eager_execution()
    port = int(sys.stdin.readline())
    me = f"{host}:{_free_port(host)}"
    worker = tf.compat.v1.train.Server(tf.train.ClusterSpec({"probe": [me]}),
                                       job_name="probe", task_index=0)
    cluster = tf.train.ClusterSpec({"ps": [f"{server}:{port}"], "worker": [me]})
    graph = tf.Graph()
    with graph.as_default():
        phases = _phases(tf)
        initialize = tf.compat.v1.global_variables_initializer()
    config = tf.compat.v1.ConfigProto(cluster_def=cluster.as_cluster_def(),
                                      operation_timeout_in_ms=TIMEOUT_SECONDS * 1000)
    with tf.compat.v1.Session(worker.target, graph=graph, config=config) as session:
        session.run(initialize)
        for name in PHASES:
            print(f"ready {name}", flush=True)
            sys.stdin.readline()
            wall, cpu = _timed(session, phases[name])
            print(f"done {name} {wall} {cpu}", flush=True)
    print("end", flush=True)


def _phases(tf) -> Dict[str, object]:
    """Each phase's op: a run on the worker alone (the session's own cost), pulls and pushes
    of SMALL and LARGE elements, and a push of ROWS rows into a table's rows."""
    ops = {}
    with tf.device("/job:worker/task:0"):
        ops["local"] = tf.reduce_sum(tf.Variable(tf.ones([SMALL])))
    for size, suffix in ((SMALL, ""), (LARGE, "-large")):
        with tf.device("/job:ps/task:0"):
            held = tf.Variable(tf.zeros([size]))
        with tf.device("/job:worker/task:0"):
            source = tf.Variable(tf.ones([size]))
            ops[f"pull{suffix}"] = tf.reduce_sum(tf.identity(held.read_value())[:1])
            pushed = source.read_value() * 1.0
        with tf.device("/job:ps/task:0"):
            ops[f"push{suffix}"] = held.assign_add(pushed).op
    with tf.device("/job:ps/task:0"):
        table = tf.Variable(tf.zeros([TABLE_ROWS, ROW_WIDTH]))
    with tf.device("/job:worker/task:0"):
        rows = tf.Variable(tf.ones([ROWS, ROW_WIDTH]))
        ids = tf.Variable(tf.range(0, TABLE_ROWS, TABLE_ROWS // ROWS))
        values, indices = rows.read_value() * 1.0, ids.read_value() + 0
    with tf.device("/job:ps/task:0"):
        ops["rows"] = tf.compat.v1.scatter_add(table, indices, values).op
    return ops


def _timed(session, op) -> Tuple[float, float]:
    for _ in range(WARM_RUNS):
        session.run(op)
    walls, started = [], time.process_time()
    for _ in range(RUNS):
        begun = time.perf_counter()
        session.run(op)
        walls.append(time.perf_counter() - begun)
    return statistics.median(walls), (time.process_time() - started) / RUNS


def probe(client_host: str, server_host: str, shell) -> Transport:
    """What TensorFlow's transport from `client_host` to `server_host` costs (two names of
    the resources; one name: within a machine)."""
    server = subprocess.Popen(_command(server_host, ["serve", server_host], shell),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    client = subprocess.Popen(_command(client_host, ["measure", client_host, server_host], shell),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        _start(server, server_host)
        _start(client, client_host)
        port = server.stdout.readline().strip()
        if not port.isdigit():
            raise RuntimeError(f"the transport probe could not start on {server_host}")
        client.stdin.write(f"{port}\n")
        client.stdin.flush()
        return _terms(_conversation(server, client))
    finally:
        for process in (client, server):
            process.kill()
            process.wait()


def _conversation(server, client) -> Dict[str, Tuple[float, float, float]]:
    """Per phase: (wall, the worker's CPU, the server's CPU) seconds a run."""
    measured, marked = {}, 0.0

    def mark() -> float:
        server.stdin.write("mark\n")
        server.stdin.flush()
        return float(server.stdout.readline())
    for line in client.stdout:
        words = line.split()
        if words[:1] == ["ready"]:
            marked = mark()
            client.stdin.write("go\n")
            client.stdin.flush()
        elif words[:1] == ["done"]:
            measured[words[1]] = (float(words[2]), float(words[3]), (mark() - marked) / RUNS)
        elif words[:1] == ["end"]:
            break
    if set(measured) != set(PHASES):
        raise RuntimeError(f"the transport probe ended after {sorted(measured)}")
    return measured


def _terms(phases: Dict[str, Tuple[float, float, float]]) -> Transport:
    """The transport's terms from the phases' times: a message is a small pull's or push's
    run less a local run; a byte, the large ones' difference over their bytes; a row, the
    server's CPU for the pushed rows less a message's and their bytes'."""
    def mean(*names, at=0):
        return statistics.mean(phases[name][at] for name in names)
    nbytes = 4 * (LARGE - SMALL)
    message = max(mean("pull", "push") - phases["local"][0], 0.0)
    worker_message = max(mean("pull", "push", at=1) - phases["local"][1], 0.0)
    server_message = mean("pull", "push", at=2)
    worker_byte = max(mean("pull-large", "push-large", at=1) - mean("pull", "push", at=1),
                      0.0) / nbytes
    server_byte = max(mean("pull-large", "push-large", at=2) - server_message, 0.0) / nbytes
    rows_bytes = 4 * ROWS * (ROW_WIDTH + 1)
    server_row = max(phases["rows"][2] - server_message - rows_bytes * server_byte, 0.0) / ROWS
    return Transport(message_seconds=message, worker_cpu_message=worker_message,
                     server_cpu_message=server_message, worker_cpu_byte=worker_byte,
                     server_cpu_byte=server_byte, server_cpu_row=server_row)


def _start(process, host: str) -> None:
    if not is_local(host):  # runner.remote_exec: its environment first
        process.stdin.write(environment_line({}).decode())
        process.stdin.flush()


def _command(host: str, args: List[str], shell) -> List[str]:
    words = [sys.executable, "-m", "parallax.planning.transport_probe", *args]
    return words if is_local(host) else shell.command(host, words, None)


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET) as free:
        free.bind((host.strip("[]"), 0))
        return free.getsockname()[1]


def _exit(status: int) -> None:
    sys.stdout.flush()
    import os  # pylint: disable=import-outside-toplevel
    os._exit(status)  # TensorFlow's server threads would keep the process


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"] and len(sys.argv) == 3:
        serve(sys.argv[2])
    elif sys.argv[1:2] == ["measure"] and len(sys.argv) == 4:
        measure(sys.argv[2], sys.argv[3])
        _exit(0)
    else:
        sys.exit(__doc__)
