"""A job's workers as threads of the test's own process: each worker reads its role, cluster and
plan from an environment of its own (contracts.environment), and trains through its own
sessions of its own in-process gRPC server, as a worker process would; the parameter servers
are servers of this process too. The driver's plan is made as the driver makes it
(driver.make_job_plans), from the graph the script builds first.

Only the process boundary is left out, so a pass's equivalence shows in seconds rather than in
a job's start-up. Horovod runs one worker per process: these jobs use TensorFlow's collectives.
Graphs are built and rewritten while other workers train, so TF1 behaviour (a process-wide
switch) cannot be part of them: the real jobs cover it.
"""
import dataclasses
import threading
from typing import Callable, List, TypeVar

import tensorflow as tf

import parallax
from parallax import contracts, driver
from parallax.planning.analysis import analyze
from parallax.runtime.grpc_server import start_server
from runner.free_ports import free_ports

T = TypeVar("T")
ADDRESS = "127.0.0.1"
TIMEOUT_SECS = 300


def run_workers(first_graph: tf.Graph, resources: str, config: parallax.Config,
                work: Callable[[], T]) -> List[T]:
    """What `work` returns on each worker, by worker id: `work` is the script's part after its
    first Parallax call (it builds its graphs and calls get_runner), run by every worker of the
    job the driver plans for `first_graph` on `resources` (their shape: all run here)."""
    config = dataclasses.replace(config, collectives="tensorflow")
    plans = driver.make_job_plans(first_graph, analyze(first_graph), resources,
                                  config.plan_options, config.launch_settings)
    cluster = plans[0].cluster
    ports = iter(free_ports(len(cluster.servers) + cluster.num_workers))
    cluster.servers = [f"{ADDRESS}:{next(ports)}" for _ in cluster.servers]
    cluster.workers = [f"{ADDRESS}:{next(ports)}" for _ in range(cluster.num_workers)]
    # TensorFlow's servers cannot be stopped in a process: these serve until it exits, on
    # ports no later job is given.
    for index in range(len(cluster.servers)):
        start_server(cluster, "ps", index)
    job_env = contracts.plan_env([plan.to_text() for plan in plans],
                                 plans[0].decision.partitions if plans[0].decision else [])
    results, errors = [None] * cluster.num_workers, []

    def worker(rank: int) -> None:
        env = {**contracts.process_env("worker", dataclasses.replace(cluster, worker_id=rank)),
               **job_env}
        try:
            with contracts.environment(env):
                results[rank] = work()
        except BaseException as error:  # pylint: disable=broad-except  (re-raised below)
            errors.append((rank, error))

    threads = [threading.Thread(target=worker, args=(rank,), name=f"worker{rank}",
                                daemon=True) for rank in range(cluster.num_workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_SECS)
    stuck = [thread.name for thread in threads if thread.is_alive()]
    if errors:
        rank, error = errors[0]
        raise AssertionError(f"worker {rank} failed: {error!r}") from error
    assert not stuck, f"{stuck} still running after {TIMEOUT_SECS} s"
    return results
