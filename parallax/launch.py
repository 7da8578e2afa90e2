"""Driver side: the user's `python my_script.py` becomes the driver, which starts one worker
process per slot re-running the same command, and leaves with the job's exit status.

Each worker learns its role from the environment; `runner` does the process work.
"""
from __future__ import annotations

import os
import sys
from typing import Dict, List, NoReturn, Tuple

from parallax.config import Config
from parallax.errors import ParallaxError
from runner import GlooRendezvous, JobFailed, ProcessSpec, load_resources, run_processes
from runner.resources import Host, is_local

ROLE_ENV = "PARALLAX_ROLE"
WORKER_ID_ENV = "PARALLAX_WORKER_ID"
NUM_WORKERS_ENV = "PARALLAX_NUM_WORKERS"


def role() -> str:
    return os.environ.get(ROLE_ENV, "driver")


def worker_count_and_id() -> Tuple[int, int]:
    """(number of workers, this worker's id); (1, 0) in a process that is not a worker."""
    if role() != "worker":
        return 1, 0
    return int(os.environ[NUM_WORKERS_ENV]), int(os.environ[WORKER_ID_ENV])


def worker_slots(resources: str) -> List[Tuple[Host, int]]:
    """Every worker of the job as (host, slot id), in rank order."""
    hosts = load_resources(resources)
    remote = [h.name for h in hosts if not is_local(h.name)]
    if remote:
        raise ParallaxError(
            f"hosts {remote} are not this machine, and launching over ssh is not available in "
            "this version: use this machine's names ('localhost', 127.0.0.x)")
    return [(host, slot) for host in hosts for slot in host.slots]


def run_driver(resources: str, config: Config) -> NoReturn:
    slots = worker_slots(resources)
    per_host: Dict[str, int] = {}
    for host, _ in slots:
        per_host[host.name] = per_host.get(host.name, 0) + 1
    if config.redirect_path:
        os.makedirs(config.redirect_path, exist_ok=True)
    with GlooRendezvous(list(per_host.items()), address="127.0.0.1") as rendezvous:
        specs = [_worker_spec(rank, slot, len(slots), rendezvous, config)
                 for rank, (_, slot) in enumerate(slots)]
        try:
            run_processes(specs)
        except JobFailed as failure:
            print(f"parallax: {failure}", file=sys.stderr, flush=True)
            sys.exit(failure.exit_code)
    sys.exit(0)


def _worker_spec(rank: int, slot: int, num_workers: int, rendezvous: GlooRendezvous,
                 config: Config) -> ProcessSpec:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    env.update(rendezvous.env_for_rank(rank))
    env.update({ROLE_ENV: "worker", WORKER_ID_ENV: str(rank), NUM_WORKERS_ENV: str(num_workers),
                "CUDA_VISIBLE_DEVICES": str(slot), "PYTHONUNBUFFERED": "1"})
    log_file = (os.path.join(config.redirect_path, f"worker_{rank}.log")
                if config.redirect_path else None)
    # orig_argv keeps interpreter options and '-m module', so the worker runs what the user ran.
    argv = [sys.executable] + sys.orig_argv[1:]
    return ProcessSpec(name=f"worker {rank}", argv=argv, env=env, cwd=os.getcwd(),
                       log_file=log_file)
