"""The planner's problem: everything the proposal and the explanation read, as plain values
without TensorFlow — the variables' statistics, the cluster, the measured terms, and what the
graph and the options allow. planner.pose makes it from a graph's analysis and measurement;
`python -m parallax.plan` makes it for a cluster that need not exist."""
from __future__ import annotations

import dataclasses
import re
from typing import Collection, Dict, FrozenSet, List, Optional, Tuple

from parallax.planning.cost import (Collective, CpuBudget, Links, Shape, Transport,
                                    VariableStats, shared_compute)


@dataclasses.dataclass(frozen=True)
class Cores:
    """What the workers of a machine compute on, as the link probe found the first two
    machines: the cores a process may run on, and how many machines run on one kernel
    (network namespaces or containers of one host), sharing its cores."""
    per_machine: int
    machines_per_kernel: int = 1

    @classmethod
    def of(cls, machines: List[dict], job_machines: int) -> "Cores":
        """From the link probe's records of two machines (runner.link_probe.machine): when
        they run on one kernel, so do all `job_machines` of the job, taken to be alike."""
        kernels = {m.get("kernel") for m in machines}
        shared = len(machines) > 1 and len(kernels) == 1 and None not in kernels
        return cls(min(int(m["cores"]) for m in machines), job_machines if shared else 1)


@dataclasses.dataclass(frozen=True)
class Compute:
    """One worker's training step alone, as measured (or as the user gave it)."""
    alone: float  # seconds of wall time
    cpu: float  # seconds of its threads' CPU time


@dataclasses.dataclass(frozen=True)
class Partition:
    """A call of parallax.get_partitioner, whose variable's shard count the search chooses."""
    name: str
    shards: Tuple[str, ...]  # as the driver's graph made them
    min_shards: int


@dataclasses.dataclass(frozen=True)
class Problem:
    # Each variable the plan places; one a get_partitioner call made, whole (its shards summed)
    variables: Dict[str, VariableStats]
    shape: Shape
    run_option: str = "AUTO"  # another: its rule's methods, and only servers and shards chosen
    links: Links = Links()  # between machines
    links_measured: bool = False
    inside: Optional[Links] = None  # within a machine, as measured
    cores: Cores = Cores(1)
    compute: Optional[Compute] = None
    compute_problem: Optional[str] = None  # why compute is None
    unmeasured: Optional[str] = None  # why the variables' rows were not measured: a rule's plan
    summable: FrozenSet[str] = frozenset()  # sparse variables whose rows may be summed by id
    off_servers: FrozenSet[str] = frozenset()  # the gradients wait for their updates
    # Dynamic embeddings' variables (parallax.dynamic_embedding): only servers hold them,
    # split over every machine, as their keys are (rewriting/passes/dynamic_tables.py)
    tables: FrozenSet[str] = frozenset()
    partitions: Tuple[Partition, ...] = ()  # with search_partitions
    # Sparse variables the workers may split over servers (largest first, all together), and
    # why each other one is kept whole
    splittable: Tuple[str, ...] = ()
    whole: Dict[str, str] = dataclasses.field(default_factory=dict)
    split: Optional[bool] = None  # Config.split_variables: None, the cost model decides
    machine_stages: Optional[bool] = None  # None: the cost model decides
    local_aggregation: bool = True  # PSConfig's options that change the bytes
    unique_pulls: bool = True
    untimed: Optional[str] = None  # why the plans cannot take turns on the cluster
    transport: Optional[Transport] = None  # TensorFlow's gRPC, as probed; None: not priced
    collective: Optional[Collective] = None  # the job's collectives, as probed; None: not
    trial_margin: Optional[float] = None  # Config.trial_margin

    @property
    def priced(self) -> Dict[str, bool]:
        """The keywords of cost.link_phases for the parameter-server options that run."""
        return {"local_aggregation": self.local_aggregation, "unique_pulls": self.unique_pulls}

    @property
    def sharing(self) -> int:
        """Workers whose compute shares one machine's cores."""
        return self.shape.workers_per_machine * self.cores.machines_per_kernel

    @property
    def budget(self) -> Optional[CpuBudget]:
        """The cores that bound a step from below, with what each worker computes on them."""
        if self.compute is None:
            return None
        return CpuBudget(self.compute.cpu, self.cores.per_machine,
                         self.cores.machines_per_kernel)

    @property
    def whole_step_priced(self) -> bool:
        """Whether the predicted step prices the synchronization's CPU (cost.cpu_floor)."""
        return self.transport is not None and self.budget is not None

    @property
    def worker_compute(self) -> Optional[float]:
        """Seconds of a worker's compute in the job, its machine's cores shared."""
        if self.compute is None:
            return None
        return shared_compute(self.compute.alone, self.compute.cpu, self.sharing,
                              self.cores.per_machine)


def shard_name(variable: str, j: int) -> str:
    """Shard j of a variable in row shards: TensorFlow's name for a partitioned variable's,
    which Parallax's own split (rewriting/split_variables.py) uses too."""
    return f"{variable}/part_{j}"


def whole_name(name: str) -> str:
    """The variable shard `name` (shard_name's) is of; `name` itself if not a shard's."""
    return re.sub(r"/part_\d+$", "", name)


def shards_in(variable: str, names: Collection[str]) -> List[str]:
    """The names of `variable`'s shards among `names`, in order (none: it is not split)."""
    shards = []
    while shard_name(variable, len(shards)) in names:
        shards.append(shard_name(variable, len(shards)))
    return shards
