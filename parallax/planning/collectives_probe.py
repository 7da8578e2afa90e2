"""A short probe of the job's collectives library (Horovod's gloo, or TensorFlow's collective
ops), as a job's allreduce and allgather use it: two ranks on one machine time an allreduce of
a small and of a large tensor and an allgather of rows, each run's wall time and each rank's
CPU. The cost model prices a step's collectives with what it measures (cost.Collective),
where the transport probe's gRPC costs would price them too high: gloo's messages cost far less
CPU than a gRPC pull (benchmarks/results-predictions).

    python -m parallax.planning.collectives_probe run LIBRARY HOST
        on HOST: starts two ranks there (LIBRARY's rendezvous or servers listening on HOST's
        address), prints the terms as JSON, and ends (at most TIMEOUT_SECONDS)
    python -m parallax.planning.collectives_probe rank LIBRARY RANK WORKERS
        one rank: prints, as JSON, per phase (wall, its CPU) seconds a run; it ends by
        itself after TIMEOUT_SECONDS (a peer gone leaves it waiting in a collective)

`probe(library, host, shell)` starts the ranks, from `run` over ssh where `host` is not this
machine.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Tuple

from parallax.planning.cost import Collective
from parallax.planning.transport_probe import printed_json
from runner.free_ports import free_ports
from runner.resources import is_local

RANKS = 2
RUNS, WARM_RUNS = 20, 3
SMALL, LARGE = 1, 1 << 20  # float32 elements of the small and the large allreduce
ROWS, ROW_WIDTH = 1024, 64  # the rows each rank gathers
TIMEOUT_SECONDS = 60  # a run takes about 10 s; a rank that cannot reach the other waits
LIBRARIES = ("horovod", "tensorflow")


def probe(library: str, host: str, shell) -> Collective:
    """What `library`'s collectives cost on `host` (a name of the resources): its ranks
    started from here where it is this machine, else from a `run` there."""
    if is_local(host):
        return measure_ranks(library, host)
    words = [sys.executable, "-m", "parallax.planning.collectives_probe", "run", library, host]
    terms = printed_json(shell.oneshot(host, words), f"the collectives probe on {host}",
                         2 * TIMEOUT_SECONDS)
    if set(terms) != set(Collective.__dataclass_fields__) - {"library"}:
        raise RuntimeError(f"the collectives probe measured {sorted(terms)}")
    return Collective(**{name: float(value) for name, value in terms.items()}, library=library)


def run(library: str, host: str) -> None:
    """measure_ranks's terms, printed."""
    measured = dataclasses.asdict(measure_ranks(library, host))
    del measured["library"]  # the caller's to name
    print(json.dumps(measured), flush=True)


def measure_ranks(library: str, host: str) -> Collective:
    """The terms of two ranks on this machine (`host`), started as `library` starts a job's."""
    env, workers = dict(os.environ), ",".join(f"{host}:{port}" for port in free_ports(RANKS))
    rendezvous = None
    if library == "horovod":
        from runner.rendezvous import GlooRendezvous  # pylint: disable=C0415  (Horovod's)
        rendezvous = GlooRendezvous([(host, RANKS)], "127.0.0.1")
    ranks, errors = [], [tempfile.TemporaryFile("w+") for _ in range(RANKS)]
    try:
        for rank in range(RANKS):
            own = dict(env, **(rendezvous.env_for_rank(rank, gloo_iface="lo") if rendezvous
                               else {}))
            ranks.append(subprocess.Popen(
                [sys.executable, "-m", "parallax.planning.collectives_probe", "rank", library,
                 str(rank), workers], env=own, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=errors[rank], text=True))
        deadline = time.monotonic() + TIMEOUT_SECONDS
        # A rank that fails leaves the other waiting in its first collective: stop at once.
        while (any(rank.poll() is None for rank in ranks)
               and not any(rank.returncode for rank in ranks) and time.monotonic() < deadline):
            time.sleep(0.1)
        for rank, error in zip(ranks, errors):
            if rank.returncode != 0:
                error.seek(0)
                raise RuntimeError(f"rank {ranks.index(rank)} "
                                   + (f"failed: {error.read().strip().splitlines()[-1:]}"
                                      if rank.returncode else
                                      f"did not end within {TIMEOUT_SECONDS} s"))
        measured = [json.loads(rank.stdout.read().strip().splitlines()[-1]) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()
        for error in errors:
            error.close()
        if rendezvous is not None:
            rendezvous.stop()
    return dataclasses.replace(terms(measured), library=library)


def rank(library: str, index: int, workers: List[str]) -> None:
    threading.Timer(TIMEOUT_SECONDS, os._exit, (3,)).start()
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from parallax import collectives  # pylint: disable=import-outside-toplevel
    from parallax.cluster import Cluster  # pylint: disable=import-outside-toplevel
    tf.compat.v1.disable_eager_execution()
    cluster = Cluster([0] * RANKS, workers=workers if library == "tensorflow" else [],
                      worker_id=index, collectives=library)
    servers = []

    def server():
        if not servers:
            servers.append(tf.compat.v1.train.Server(
                tf.train.ClusterSpec({"worker": workers}), job_name="worker",
                task_index=index, config=library_of.configure(tf.compat.v1.ConfigProto())))
        return servers[0]

    library_of = collectives.create(cluster, server)
    library_of.join(stages=False)
    graph = tf.Graph()
    with graph.as_default():
        ops = _phases(tf, library_of)
        initialize = tf.compat.v1.global_variables_initializer()
    session = library_of.session(graph)
    session.run(initialize)
    measured = {name: _timed(session, ops[name]) for name in ops}
    session.close()
    library_of.leave()
    print(json.dumps(measured), flush=True)


def _phases(tf, library) -> Dict[str, object]:
    """Each phase's op: a run without collectives (the session's own cost), the allreduce of
    SMALL and of LARGE elements, and the allgather of ROWS rows (a sparse gradient's)."""
    ops = {"local": tf.reduce_sum(tf.Variable(tf.ones([SMALL])))}
    for size, name in ((SMALL, "small"), (LARGE, "large")):
        ops[name] = tf.reduce_sum(library.allreduce(
            tf.Variable(tf.ones([size])).read_value() * 1.0, average=False)[:1])
    rows = tf.Variable(tf.ones([ROWS, ROW_WIDTH]))
    ids = tf.Variable(tf.range(ROWS, dtype=tf.int64))
    gathered = library.allgather_slices(
        tf.IndexedSlices(rows.read_value() * 1.0, ids.read_value() + 0, [ROWS, ROW_WIDTH]),
        average=False)
    ops["gather"] = tf.reduce_sum(gathered.values[:1]) + tf.cast(gathered.indices[0],
                                                                  tf.float32)
    return ops


def _timed(session, op) -> Tuple[float, float]:
    """The least wall and CPU time of a run: other processes on the cores only add to a
    run's wall time, and to its CPU where the library polls while it waits (Horovod's
    background loop runs a cycle every millisecond). The process's CPU counts the library's
    own threads (that loop, the gRPC server's)."""
    for _ in range(WARM_RUNS):
        session.run(op)
    walls, cpus = [], []
    for _ in range(RUNS):
        begun, cpu = time.perf_counter(), time.process_time()
        session.run(op)
        walls.append(time.perf_counter() - begun)
        cpus.append(time.process_time() - cpu)
    return min(walls), min(cpus)


def terms(ranks: List[Dict[str, Tuple[float, float]]]) -> Collective:
    """The terms from the ranks' phases (their mean CPU): of RANKS ranks, an allreduce in a
    ring sends and receives 2(RANKS-1) messages, 2 x bytes x (RANKS-1)/RANKS in all; an
    allgather, RANKS-1 messages of the peers' rows."""
    def cpu(name):
        return sum(measured[name][1] for measured in ranks) / len(ranks)

    def wall(name):
        return min(measured[name][0] for measured in ranks)
    messages = 2 * (RANKS - 1)
    per_message = max(cpu("small") - cpu("local"), 0.0) / messages
    reduced = 2 * 4 * (LARGE - SMALL) * (RANKS - 1) / RANKS
    per_byte = max(cpu("large") - cpu("small"), 0.0) / reduced
    gathered = (RANKS - 1) * ROWS * (4 * ROW_WIDTH + 8)
    per_gather = max(cpu("gather") - cpu("local") - gathered * per_byte, 0.0) / (RANKS - 1)
    return Collective(message_seconds=max(wall("small") - wall("local"), 0.0) / messages,
                      cpu_message=per_message, cpu_byte=per_byte, cpu_allgather=per_gather)


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"] and len(sys.argv) == 4 and sys.argv[2] in LIBRARIES:
        run(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["rank"] and len(sys.argv) == 5 and sys.argv[2] in LIBRARIES:
        rank(sys.argv[2], int(sys.argv[3]), sys.argv[4].split(","))
        sys.stdout.flush()
        os._exit(0)  # TensorFlow's server threads would keep the process
    else:
        sys.exit(__doc__)
