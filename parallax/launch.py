"""Driver side: the user's `python my_script.py` becomes the driver, which starts one worker
process per slot re-running the same command (and, for the PS path, one parameter server per
machine), and leaves with the job's exit status.

Each process learns its role and the cluster from the environment; `runner` does the process
work.
"""
from __future__ import annotations

import contextlib
import os
import socket
import sys
from typing import Dict, List, NoReturn, Tuple

from parallax.cluster import CLUSTER_ENV, SERVER_INDEX_ENV, Cluster
from parallax.config import Config
from parallax.errors import ParallaxError
from runner import GlooRendezvous, JobFailed, ProcessSpec, load_resources, run_processes
from runner.resources import Host, is_local

ROLE_ENV = "PARALLAX_ROLE"


def role() -> str:
    return os.environ.get(ROLE_ENV, "driver")


def worker_count_and_id() -> Tuple[int, int]:
    """(number of workers, this worker's id); (1, 0) in a process that is not a worker."""
    if role() != "worker":
        return 1, 0
    cluster = Cluster.from_env()
    return cluster.num_workers, cluster.worker_id


def _hosts(resources: str) -> List[Host]:
    hosts = load_resources(resources)
    remote = [h.name for h in hosts if not is_local(h.name)]
    if remote:
        raise ParallaxError(
            f"hosts {remote} are not this machine, and launching over ssh is not available in "
            "this version: use this machine's names ('localhost', 127.0.0.x)")
    return hosts


def run_driver(resources: str, config: Config, run_option: str) -> NoReturn:
    hosts = _hosts(resources)
    slots = [(machine, host, slot) for machine, host in enumerate(hosts) for slot in host.slots]
    with_servers = run_option in ("PS", "HYBRID")
    with _free_ports(len(hosts) + len(slots) if with_servers else 0) as ports:
        cluster = Cluster(worker_machines=[machine for machine, _, _ in slots])
        if with_servers:
            cluster.servers = [f"{h.name}:{port}" for h, port in zip(hosts, ports)]
            cluster.workers = [f"{host.name}:{port}"
                               for (_, host, _), port in zip(slots, ports[len(hosts):])]
    if config.redirect_path:
        os.makedirs(config.redirect_path, exist_ok=True)
    with contextlib.ExitStack() as stack:
        rendezvous = None
        if run_option in ("AR", "HYBRID"):
            per_host: Dict[str, int] = {}
            for _, host, _ in slots:
                per_host[host.name] = per_host.get(host.name, 0) + 1
            rendezvous = stack.enter_context(
                GlooRendezvous(list(per_host.items()), address="127.0.0.1"))
        specs = [_server_spec(index, cluster, config) for index in range(len(cluster.servers))]
        specs += [_worker_spec(rank, slot, cluster, rendezvous, config)
                  for rank, (_, _, slot) in enumerate(slots)]
        try:
            run_processes(specs)
        except JobFailed as failure:
            print(f"parallax: {failure}", file=sys.stderr, flush=True)
            sys.exit(failure.exit_code)
    sys.exit(0)


@contextlib.contextmanager
def _free_ports(count: int):
    """Ports free right now, held open together so none is handed out twice."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("", 0))
        yield [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _base_env(cluster: Cluster) -> Dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    env.update({CLUSTER_ENV: cluster.to_env(), "PYTHONUNBUFFERED": "1"})
    return env


def _log_file(config: Config, name: str):
    return os.path.join(config.redirect_path, f"{name}.log") if config.redirect_path else None


def _server_spec(index: int, cluster: Cluster, config: Config) -> ProcessSpec:
    env = _base_env(cluster)
    env.update({ROLE_ENV: "server", SERVER_INDEX_ENV: str(index), "CUDA_VISIBLE_DEVICES": ""})
    return ProcessSpec(name=f"server {index}", argv=[sys.executable, "-m", "parallax.server"],
                       env=env, cwd=os.getcwd(), log_file=_log_file(config, f"server_{index}"),
                       service=True)


def _worker_spec(rank: int, slot: int, cluster: Cluster, rendezvous, config: Config):
    env = _base_env(Cluster(cluster.worker_machines, cluster.servers, cluster.workers, rank))
    if rendezvous is not None:
        env.update(rendezvous.env_for_rank(rank))
    env.update({ROLE_ENV: "worker", "CUDA_VISIBLE_DEVICES": str(slot)})
    # orig_argv keeps interpreter options and '-m module', so the worker runs what the user ran.
    argv = [sys.executable] + sys.orig_argv[1:]
    return ProcessSpec(name=f"worker {rank}", argv=argv, env=env, cwd=os.getcwd(),
                       log_file=_log_file(config, f"worker_{rank}"))
