"""A short probe of TensorFlow's gRPC transport, as the parameter-server path uses it: a
worker's pulls and pushes of a small and of a large tensor from and to a server's variable,
and a push of rows into a table (what a server aggregates and applies), each timed on the
wall and, within a machine, in both processes' CPU. The cost model prices what the link probe
(runner/link_probe.py) cannot see: the cost of each message beyond the link's latency, and the
CPU each message, byte and row takes at both ends, which on shared cores is the step's bound.

    python -m parallax.planning.transport_probe serve HOST
        a server (TensorFlow's, job "ps") on HOST; prints its port and its process id, and
        serves until it is stopped (or TIMEOUT_SECONDS)
    python -m parallax.planning.transport_probe measure HOST SERVER PORT PHASES [PID]
        the worker on HOST; prints, as JSON, per phase of PHASES (comma-separated) (wall, its
        CPU, the server's CPU) seconds a run: the server's read from its process PID, where
        it runs on this machine

`probe(first, second, shell)` runs them (over ssh where they are not this machine) and returns
a Transport: the CPU of each message, byte and row as measured within `first`, the message's
wall time between the two. TensorFlow's server listens on every interface (docs/security.md)
for the probe's seconds; it serves one variable and a table.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple

from parallax.planning.cost import Transport
from runner.resources import is_local
from runner.ssh import environment_line

RUNS, WARM_RUNS = 20, 3
SMALL, LARGE = 1, 1 << 20  # float32 elements of the small and the large tensor
ROWS, ROW_WIDTH, TABLE_ROWS = 1024, 64, 65536  # the rows a push adds into a table
TIMEOUT_SECONDS = 120
PHASES = ("local", "pull", "push", "pull-large", "push-large", "rows")
MESSAGE_PHASES = PHASES[:3]  # between machines, only a message's time is read


def probe(first: str, second: Optional[str], shell) -> Transport:
    """What TensorFlow's transport costs between the machines `first` and `second` (names of
    the resources; None: a job of one machine)."""
    within = _terms(_run(first, first, shell, PHASES))
    if second is None:
        return within
    return dataclasses.replace(
        within, message_seconds=_message_seconds(_run(first, second, shell, MESSAGE_PHASES)))


def serve(host: str) -> None:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    port = _free_port(host)
    tf.compat.v1.train.Server(tf.train.ClusterSpec({"ps": [f"{host}:{port}"]}),
                              job_name="ps", task_index=0)
    print(port, os.getpid(), flush=True)
    time.sleep(TIMEOUT_SECONDS)
    _exit(2)


def measure(host: str, server: str, port: int, phases: List[str],
            server_pid: Optional[int]) -> None:
    import psutil  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    tf.compat.v1.disable_eager_execution()
    me = f"{host}:{_free_port(host)}"
    worker = tf.compat.v1.train.Server(tf.train.ClusterSpec({"probe": [me]}),
                                       job_name="probe", task_index=0)
    cluster = tf.train.ClusterSpec({"ps": [f"{server}:{port}"], "worker": [me]})
    graph = tf.Graph()
    with graph.as_default():
        ops = _phases(tf)
        initialize = tf.compat.v1.global_variables_initializer()
    config = tf.compat.v1.ConfigProto(cluster_def=cluster.as_cluster_def(),
                                      operation_timeout_in_ms=TIMEOUT_SECONDS * 1000)
    served = psutil.Process(server_pid) if server_pid else None
    measured = {}
    with tf.compat.v1.Session(worker.target, graph=graph, config=config) as session:
        session.run(initialize)
        for name in phases:
            before = _cpu(served)
            wall, cpu = _timed(session, ops[name])
            measured[name] = (wall, cpu, (_cpu(served) - before) / RUNS)
    print(json.dumps(measured), flush=True)


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
    # The least wall time: other processes on the cores only add to a run's (a median of
    # loopback runs under load read a message as cheaper than a run on the worker alone).
    return min(walls), (time.process_time() - started) / RUNS


def _cpu(process) -> float:
    """A process's CPU seconds so far, its threads', or 0 unknown: from Linux's schedstat of
    each thread (nanoseconds), where the process's user and system times count whole ticks
    (10 ms, more than a phase's message)."""
    if process is None:
        return 0.0
    try:
        return sum(_on_cpu(f"/proc/{process.pid}/task/{thread.id}/schedstat")
                   for thread in process.threads()) / 1e9
    except (OSError, ValueError):
        times = process.cpu_times()
        return times.user + times.system


def _on_cpu(schedstat: str) -> int:
    with open(schedstat, encoding="ascii") as stat:
        return int(stat.read().split()[0])


def _run(client_host: str, server_host: str, shell, phases: Tuple[str, ...]
         ) -> Dict[str, Tuple[float, float, float]]:
    """Per phase: (wall, the worker's CPU, the server's CPU) seconds a run; the server's CPU
    is 0 where it runs on another machine."""
    server = subprocess.Popen(_command(server_host, ["serve", server_host], shell),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        if not is_local(server_host):  # runner.remote_exec: its environment first
            server.stdin.write(environment_line({}).decode())
            server.stdin.flush()
        started = server.stdout.readline().split()
        if len(started) != 2 or not all(word.isdigit() for word in started):
            raise RuntimeError(f"the transport probe could not start on {server_host}")
        port, pid = started
        measured = printed_json(
            _command(client_host, ["measure", client_host, server_host, port, ",".join(phases)]
                     + ([pid] if client_host == server_host else []), shell),
            f"the transport probe from {client_host} to {server_host}", 2 * TIMEOUT_SECONDS)
        if set(measured) != set(phases):
            raise RuntimeError(f"the transport probe measured {sorted(measured)}")
        return {name: tuple(values) for name, values in measured.items()}
    finally:
        server.kill()
        server.wait()


def printed_json(argv: List[str], probe: str, timeout: float) -> dict:
    """What a probe's command `argv` printed last, as JSON; or RuntimeError, with the last
    line of its errors."""
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{probe} failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _terms(phases: Dict[str, Tuple[float, float, float]]) -> Transport:
    """The transport's terms from the phases' times: a message is a small pull's or push's
    run less a local run; a byte, the large ones' difference over their bytes; a row, the
    server's CPU for the pushed rows less a message's and their bytes'."""
    def mean(*names, at=0):
        return statistics.mean(phases[name][at] for name in names)
    nbytes = 4 * (LARGE - SMALL)
    message = _message_seconds(phases)
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


def _message_seconds(phases: Dict[str, Tuple[float, float, float]]) -> float:
    """A small pull's or push's run, less a run on the worker alone."""
    return max(statistics.mean(phases[name][0] for name in ("pull", "push"))
               - phases["local"][0], 0.0)


def _command(host: str, args: List[str], shell) -> List[str]:
    """The server runs under runner.remote_exec (stopped when its ssh goes); the worker ends
    by itself."""
    words = [sys.executable, "-m", "parallax.planning.transport_probe", *args]
    if is_local(host):
        return words
    return shell.command(host, words, None) if args[0] == "serve" else shell.oneshot(host, words)


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET) as free:
        free.bind((host.strip("[]"), 0))
        return free.getsockname()[1]


def _exit(status: int) -> None:
    sys.stdout.flush()
    os._exit(status)  # TensorFlow's server threads would keep the process


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"] and len(sys.argv) == 3:
        serve(sys.argv[2])
    elif sys.argv[1:2] == ["measure"] and len(sys.argv) in (6, 7) and set(
            sys.argv[5].split(",")) <= set(PHASES):
        measure(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5].split(","),
                int(sys.argv[6]) if len(sys.argv) == 7 else None)
        _exit(0)
    else:
        sys.exit(__doc__)
