"""The job's topology as one worker sees it: its id, the machines, the servers. The driver
writes it into each process's environment (parallax/contracts.py); nothing here depends on
TensorFlow."""
from __future__ import annotations

import dataclasses
import json
from typing import List, Optional


@dataclasses.dataclass
class Cluster:
    worker_machines: List[int]  # machine index of each worker, by worker id
    servers: List[str] = dataclasses.field(default_factory=list)  # 'host:port', one per machine
    # 'host:port' each, when servers exist or the collectives run on the workers' servers
    workers: List[str] = dataclasses.field(default_factory=list)
    worker_id: int = 0
    # the library (parallax/collectives/): 'horovod', 'tensorflow', or None for the default one
    # (collectives.choose); the driver writes the one it chose
    collectives: Optional[str] = None

    @property
    def num_workers(self) -> int:
        return len(self.worker_machines)

    @property
    def num_machines(self) -> int:
        return max(self.worker_machines) + 1

    @property
    def machine(self) -> int:
        return self.worker_machines[self.worker_id]

    def workers_on(self, machine: int) -> List[int]:
        return [w for w, m in enumerate(self.worker_machines) if m == machine]

    def machine_groups(self) -> List[List[int]]:
        """The worker groups of an allreduce in machine stages: the workers of each machine,
        then for each position j the j-th worker of every machine. Empty unless there are
        several machines with the same number (more than one) of workers each."""
        machines = [self.workers_on(m) for m in range(self.num_machines)]
        sizes = {len(workers) for workers in machines}
        if len(machines) < 2 or len(sizes) > 1 or sizes == {1}:
            return []
        return machines + [list(group) for group in zip(*machines)]

    @property
    def is_chief(self) -> bool:
        return self.worker_id == 0

    @property
    def is_local_chief(self) -> bool:
        return self.workers_on(self.machine)[0] == self.worker_id

    @property
    def has_servers(self) -> bool:
        return bool(self.servers)

    def server_device(self, server: int) -> str:
        return f"/job:ps/task:{server}/device:CPU:0"

    def worker_device(self) -> str:
        return f"/job:worker/task:{self.worker_id}"

    def to_env(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Cluster":
        return cls(**json.loads(text))
