"""The planner's rating, the cost model: for each way of synchronizing a variable, the bytes
every machine's link carries in one step, and the step time those bytes cost on links of a
given latency and bandwidth. Pure functions of a variable's statistics and the cluster's
shape: no TensorFlow.

H machines of G workers each (N = H*G). A variable of w bytes; a sparse gradient has `rows`
rows per worker and step (repeated ids counted), each `row_bytes` of values and `index_bytes`
of index, and unique[k-1] distinct ids in k workers' batches (unique[0] = alpha * rows of the
variable, the paper's alpha). The paper's Table 3, counted per machine link:

- allreduce (ring over N workers, a machine's workers adjacent): 2w(N-1)/N each way; in
  machine stages (summed within each machine, then each of its G workers allreduces 1/G of the
  sum across machines, rewriting/machine_allreduce.py): 2w(H-1)/H;
- allgather (ring): every worker's rows with indices, q, reach every other worker: (N-1)q;
- parameter server on machine s: each worker pulls p (the rows it reads; its unique rows
  when it asks for each once) and pushes q; s sends (N-G)p and receives (N-G)q, every other
  machine receives Gp and sends Gq; with local aggregation a machine pushes its workers'
  rows summed by id once, q_G (unique[G-1] rows), so s receives (H-1)q_G;
- a variable split in k row shards over k servers moves the same rows, 1/k to each.

Compute: a worker's step alone takes `alone` seconds of wall time and `cpu` seconds of its
threads' CPU time; G workers sharing a machine's C cores take G*cpu/C when that is longer. The
update of a variable a server holds leaves the workers' compute and is done once, by that
server, after the pushes it waits for: each worker computes its step less those updates' share,
and the server whose updates take the largest share of a worker's compute (on a machine's
cores as shared as its workers') makes the step wait that long. Work a server may do before
the gradient comes (passes/defer_server_work.py) is priced as if it did not.

Time: each link is a full-duplex pipe of `bandwidth` bytes/s that adds `latency` per message.
A synchronous step communicates in two phases, one after the other: the pulls from servers
before the compute (the rows of this step's batch, after the last step's update), then the
pushes, allreduces and allgathers. Each phase takes as long as its busiest link direction: a
server's machine sends in the first and receives in the second, so one machine serving much is
paid for twice. The second phase follows the compute, except a worker's pushes of dense
gradients to servers, which leave as each gradient is ready (`ready`, traced on one worker)
while the backward pass goes on. Allreduce in machine stages costs two more cycles of
Horovod's background thread (MACHINE_STAGES_SECONDS).

A dynamic embedding (parallax.dynamic_embedding) is a sparse variable on servers whose rows
only the servers know: before its pull, each worker sends its step's distinct ids to the
servers that own them and gets their rows' indices back, `id_bytes` each way per id, 1/k to
each of its k parts.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Dict, List, Optional, Sequence, Tuple


class Sync(str, enum.Enum):
    """How a variable is synchronized: the one name for it, in the plan and in the cost model
    (a str, so that it travels in JSON as its value)."""
    ALLREDUCE = "allreduce"  # replicated; dense gradient summed/averaged with Horovod
    ALLGATHER = "allgather"  # replicated; sparse gradient slices gathered from every worker
    PS = "parameter server"  # one copy on a server; gradients aggregated there

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


ALLREDUCE, ALLGATHER, PS = Sync.ALLREDUCE, Sync.ALLGATHER, Sync.PS


# A dynamic embedding's id, and its row's index, as a lookup sends them to the servers and
# back: int64 (a string id is priced as one).
ID_BYTES = 8


@dataclasses.dataclass(frozen=True)
class VariableStats:
    name: str
    nbytes: int  # the whole variable
    rows: Optional[int] = None  # gradient rows per worker and step; None: a dense gradient
    row_bytes: int = 0
    index_bytes: int = 8
    unique: Tuple[int, ...] = ()  # distinct ids in the batches of 1, 2, ... N workers
    reads: int = 1  # pulls of a dense server variable a step (a while loop's iterations)
    # The share of a worker's compute done when its gradient is ready (traced on one worker);
    # 1.0: at the end, as taken when not measured.
    ready: float = 1.0
    # The share of a worker's compute that is this variable's update (its optimizer's ops from
    # the gradient to its and its slots' writes, traced on one worker); 0.0 when not measured.
    update: float = 0.0
    table_rows: int = 0  # rows of a sparse variable's table (alpha = distinct(1) / table_rows)
    # A dynamic embedding's (ID_BYTES): the bytes of each distinct id a worker's step sends to
    # the server that owns it to be given its row, and of that row's index back; 0: a variable
    # whose rows the workers know.
    id_bytes: int = 0

    @property
    def sparse(self) -> bool:
        return self.rows is not None

    def distinct(self, workers: int) -> int:
        return self.unique[min(workers, len(self.unique)) - 1] if self.unique else self.rows


@dataclasses.dataclass(frozen=True)
class Shape:
    """The cluster as the cost model sees it (parallax.cluster.Cluster is the job's own)."""
    machines: int
    workers_per_machine: int

    @property
    def workers(self) -> int:
        return self.machines * self.workers_per_machine


@dataclasses.dataclass(frozen=True)
class Links:
    bandwidth: float = 12.5e6  # bytes/s each way between machines (100 Mbit/s)
    latency: float = 200e-6  # seconds a message costs besides its bytes


@dataclasses.dataclass(frozen=True)
class Transport:
    """What TensorFlow's gRPC transport costs beyond the link's bytes and latency, as its probe
    measured it (planning/transport_probe.py): seconds of wall time a message (a pull or a
    push) takes, and CPU seconds a message, a byte and a pushed row take in the worker and in
    the server."""
    message_seconds: float
    worker_cpu_message: float
    server_cpu_message: float
    worker_cpu_byte: float
    server_cpu_byte: float
    server_cpu_row: float


@dataclasses.dataclass(frozen=True)
class Collective:
    """What the job's collectives library costs, as its probe measured it on one machine
    (planning/collectives_probe.py): seconds of wall time a message of a ring takes, and a
    worker's CPU seconds a message (sent and received), a byte, and an allgather of slices
    beyond its bytes take."""
    message_seconds: float
    cpu_message: float
    cpu_byte: float
    cpu_allgather: float
    library: str = "the transport's"  # which was probed

    @classmethod
    def over(cls, transport: "Transport") -> "Collective":
        """Where the library was not probed: each message and byte at the gRPC transport's
        cost at both ends (TensorFlow's collectives go through its gRPC as a pull does)."""
        message = transport.worker_cpu_message + transport.server_cpu_message
        return cls(message_seconds=transport.message_seconds, cpu_message=message,
                   cpu_byte=transport.worker_cpu_byte + transport.server_cpu_byte,
                   cpu_allgather=message)


@dataclasses.dataclass(frozen=True)
class CpuBudget:
    """What bounds a step from below where processes share cores: one worker's compute, in
    CPU seconds a step alone, a machine's cores, and how many machines share one kernel's."""
    worker_cpu: float
    cores: int
    machines_per_kernel: int = 1


@dataclasses.dataclass(frozen=True)
class Method:
    how: Sync
    servers: Tuple[int, ...] = ()  # PS: the machines holding its shards

    def __str__(self):
        if self.how != PS:
            return str(self.how)
        return f"{PS} on {'machine' if len(self.servers) == 1 else 'machines'} " + ", ".join(
            map(str, self.servers))


Traffic = List[List[float]]  # per machine: [bytes sent, bytes received]


def ps_options(ps_config) -> Dict[str, bool]:
    """The keywords of link_phases (and of what calls it) for the parameter-server path's
    options that run (a parallax.PSConfig)."""
    return {"local_aggregation": ps_config.local_aggregation,
            "unique_pulls": ps_config.boundary_between_workers_and_servers}


def link_bytes(var: VariableStats, method: Method, cluster: Shape,
               local_aggregation: bool = True, unique_pulls: bool = True,
               hierarchical_allreduce: bool = False) -> Traffic:
    """The bytes each machine's link sends and receives in one step for `var` under `method`."""
    pull, push = link_phases(var, method, cluster, local_aggregation, unique_pulls,
                             hierarchical_allreduce)
    return [[p[0] + q[0], p[1] + q[1]] for p, q in zip(pull, push)]


def link_phases(var: VariableStats, method: Method, cluster: Shape,
                local_aggregation: bool = True, unique_pulls: bool = True,
                hierarchical_allreduce: bool = False) -> Tuple[Traffic, Traffic]:
    """link_bytes in the step's two phases: (pulls before the compute, what follows it)."""
    h, g, n = cluster.machines, cluster.workers_per_machine, cluster.workers
    before = [[0.0, 0.0] for _ in range(h)]
    after = [[0.0, 0.0] for _ in range(h)]
    if h == 1:
        return before, after
    if method.how == ALLREDUCE:
        ring = h if hierarchical_allreduce else n  # with G = 1 the same
        for link in after:
            link[0] = link[1] = 2 * var.nbytes * (ring - 1) / ring
        return before, after
    if not var.sparse:
        pull, push = var.reads * var.nbytes, var.nbytes
        summed = push
    else:
        pull = (var.distinct(1) if unique_pulls else var.rows) * var.row_bytes
        push = var.rows * (var.row_bytes + var.index_bytes)
        summed = var.distinct(g) * (var.row_bytes + var.index_bytes)
    ids = var.distinct(1) * var.id_bytes if var.sparse else 0  # out, and their rows back
    if method.how == ALLGATHER:
        for link in after:
            link[0] = link[1] = (n - 1) * push
        return before, after
    aggregated = var.sparse and local_aggregation
    k = len(method.servers)
    for server in method.servers:  # each shard: 1/k of the rows
        for machine in range(h):
            if machine == server:
                before[machine][0] += (n - g) * (pull + ids) / k
                before[machine][1] += (n - g) * ids / k
                after[machine][1] += ((h - 1) * summed if aggregated else (n - g) * push) / k
            else:
                after[machine][0] += (summed if aggregated else g * push) / k
                before[machine][0] += g * ids / k
                before[machine][1] += g * (pull + ids) / k
    return before, after


def messages(var: VariableStats, method: Method, cluster: Shape) -> int:
    """Messages in sequence on the busiest link in one step (each costs a latency)."""
    if cluster.machines == 1:
        return 0
    if method.how in (ALLREDUCE, ALLGATHER):
        return 2 * (cluster.workers - 1) if method.how == ALLREDUCE else cluster.workers - 1
    return 2  # a push and a pull, to every shard at once


# Machine stages are three collectives in sequence where a ring is one, each waiting for a
# cycle of Horovod's background thread (collectives/horovod.py's CYCLE_TIME_MS; measured on
# lm and nmt: benchmarks/HISTORY.md).
MACHINE_STAGES_SECONDS = 2 * 5e-3


def machine_stages_pay(allreduced_bytes: float, cluster: Shape, links: Links) -> bool:
    """Whether a step's allreduces of `allreduced_bytes` in all, in machine stages, are faster
    than in one ring (step_time: each machine link carries 2w(H-1)/H instead of 2w(N-1)/N, for
    two more Horovod cycles). Without AUTO's measurements the plan's other traffic is not
    known; AUTO compares whole plans (choose_with_allreduce_form)."""
    stats = {"allreduced": VariableStats("allreduced", int(allreduced_bytes))}
    choice = {"allreduced": Method(ALLREDUCE)}
    ring, stages = (step_time(choice, stats, cluster, links, hierarchical_allreduce=staged)
                    for staged in (False, True))
    return stages < ring


def shared_compute(alone: float, cpu: float, workers_per_machine: int, cores: int) -> float:
    """Seconds of a worker's compute when `workers_per_machine` workers share a machine's
    `cores`: its step alone, unless together they need more CPU than the cores give in that
    time (CPU training: a worker alone already runs its independent ops on several cores)."""
    return max(alone, workers_per_machine * cpu / max(cores, 1))


def step_time(choice: Dict[str, Method], stats: Dict[str, VariableStats], cluster: Shape,
              links: Links, compute: float = 0.0, alone: Optional[float] = None,
              **options) -> float:
    """Seconds per step of a whole plan: the sum of its step_terms."""
    return sum(step_terms(choice, stats, cluster, links, compute, alone, **options).values())


def step_terms(choice: Dict[str, Method], stats: Dict[str, VariableStats], cluster: Shape,
               links: Links, compute: float = 0.0, alone: Optional[float] = None,
               transport: Optional[Transport] = None, budget: Optional[CpuBudget] = None,
               collective: Optional[Collective] = None, **options) -> Dict[str, float]:
    """The seconds of a step, term by term, in their order: the pulls (the first phase's
    busiest link direction), then the compute and what the second phase's busiest link
    direction takes beyond it (its pushes of dense gradients to servers go as each is ready,
    pushed_when_ready), then the busiest server's updates (server_updates; at the speed of a
    worker alone on its machine, `alone` seconds a step, `compute` when not given), and the
    waits of the messages and machine stages (`waits`; a message to a server costs the
    `transport`'s where it was probed, a ring's message the `collective`'s). Last, with the
    `transport` and a `budget`, what the cores of the busiest kernel need beyond the other
    terms (cpu_floor): where workers and servers share cores, their CPU bounds the step,
    whatever the links."""
    phases, second = no_traffic(cluster), []
    for name, method in choice.items():
        traffic = link_phases(stats[name], method, cluster, **options)
        phases = added(phases, traffic)
        second.append((name, method, traffic[1]))
    machine, direction = busiest_link(phases[1])
    pushes = [(stats[name].ready if pushed_when_ready(stats[name], method) else 1.0,
               traffic[machine][direction] / links.bandwidth)
              for name, method, traffic in second]
    off, held = server_updates(choice, stats, cluster)
    worker, link = _compute_and_link(compute, pushes, off)
    staged = options.get("hierarchical_allreduce", False)
    terms = {"pulls": busiest_bytes(phases[:1]) / links.bandwidth,
             "compute": worker, "pushes after the compute": max(0.0, link - worker),
             "servers' updates": max(held, default=0.0) * (compute if alone is None else alone),
             "messages": _message_seconds(choice, stats, cluster, links, transport,
                                          collective),
             "machine stages": MACHINE_STAGES_SECONDS if _staged(choice, staged) else 0.0}
    if transport is not None and budget is not None:
        floor = cpu_floor(choice, stats, cluster, transport, budget,
                          collective=collective, **options)
        terms["cores"] = max(0.0, floor - sum(terms.values()))
    return terms


def _message_seconds(choice, stats, cluster, links, transport, collective) -> float:
    """The longest chain of messages a step waits for: a latency each, or the transport's
    own cost of a message (a server's pulls and pushes) or the collectives' (a ring's) where
    it was probed."""
    def each(method: Method) -> float:
        probed = transport if method.how == PS else collective
        return links.latency if probed is None else max(links.latency, probed.message_seconds)
    return max((messages(stats[name], method, cluster) * each(method)
                for name, method in choice.items()), default=0.0)


def sync_cpu(choice: Dict[str, Method], stats: Dict[str, VariableStats], cluster: Shape,
             transport: Transport, local_aggregation: bool = True, unique_pulls: bool = True,
             collective: Optional[Collective] = None, **_) -> List[float]:
    """Per machine, the CPU seconds a step's messages, bytes and pushed rows take in its
    processes, as the transport probe measured each (links inside a machine included: a
    worker's pull from its own machine's server costs as much CPU). Each worker pulls every
    shard of a server variable (a dense one as often as it reads it), and pushes its gradient
    to each, or, a sparse one with local aggregation, each machine pushes its workers' rows
    summed by id once; each allreduces and allgathers the others (_collective_cpu, at the
    `collective`'s costs, else at the transport's)."""
    h, g, n = cluster.machines, cluster.workers_per_machine, cluster.workers
    ring = _collective_cpu([stats[name] for name, m in choice.items() if m.how != PS],
                           [m for m in choice.values() if m.how != PS], n,
                           collective or Collective.over(transport))
    spent = [g * ring] * h
    for name, method in choice.items():
        if method.how != PS:
            continue
        var, k = stats[name], len(method.servers)
        if var.sparse:
            pull = (var.distinct(1) if unique_pulls else var.rows) * var.row_bytes
            row = var.row_bytes + var.index_bytes
            aggregated = local_aggregation
            pushed = var.distinct(g) * row if aggregated else g * var.rows * row  # a machine's
            rows, reads = (h * var.distinct(g) if aggregated else n * var.rows), 1
        else:
            pull, pushed, rows, reads, aggregated = var.nbytes, g * var.nbytes, 0, var.reads, False
        pushes = 1 if aggregated else g  # a machine's, to each shard
        for server in method.servers:  # each shard 1/k of the bytes and rows
            spent[server] += (h * (g * reads + pushes) * transport.server_cpu_message
                              + h * (g * reads * pull + pushed) / k * transport.server_cpu_byte
                              + rows / k * transport.server_cpu_row)
        for machine in range(h):
            spent[machine] += (k * (g * reads + pushes) * transport.worker_cpu_message
                               + (g * reads * pull + pushed) * transport.worker_cpu_byte)
    return spent


def _collective_cpu(variables: List[VariableStats], methods: List[Method], workers: int,
                    collective: Collective) -> float:
    """A worker's CPU for a step's allreduces and allgathers at the `collective`'s costs. The
    allreduced gradients go in one buffer (Horovod's fusion, the TensorFlow collectives'
    buckets): one ring of 2(N-1) messages, of 2w(N-1)/N bytes in all; each allgather is
    N-1 gathers of its peers' rows."""
    if workers == 1:
        return 0.0
    messages, gathers, nbytes = 0, 0, 0.0
    allreduced = sum(var.nbytes for var, m in zip(variables, methods) if m.how == ALLREDUCE)
    if allreduced:
        messages, nbytes = 2 * (workers - 1), 2 * allreduced * (workers - 1) / workers
    for var, method in zip(variables, methods):
        if method.how == ALLGATHER:
            gathers += workers - 1
            nbytes += (workers - 1) * var.rows * (var.row_bytes + var.index_bytes)
    return (messages * collective.cpu_message + gathers * collective.cpu_allgather
            + nbytes * collective.cpu_byte)


def cpu_floor(choice: Dict[str, Method], stats: Dict[str, VariableStats], cluster: Shape,
              transport: Transport, budget: CpuBudget, **options) -> float:
    """Seconds a step takes at least on the busiest kernel's cores: its machines' workers'
    compute (less the updates the servers take off them), the servers' updates, and the
    synchronization's CPU (sync_cpu)."""
    off, held = server_updates(choice, stats, cluster)
    spent = [cluster.workers_per_machine * budget.worker_cpu * (1 - off)
             + held[machine] * budget.worker_cpu + sync
             for machine, sync in enumerate(sync_cpu(choice, stats, cluster, transport,
                                                     **options))]
    shared = max(budget.machines_per_kernel, 1)
    return max(sum(spent[i:i + shared]) for i in range(0, len(spent), shared)) / max(
        budget.cores, 1)


def server_updates(choice: Dict[str, Method], stats: Dict[str, VariableStats],
                   cluster: Shape) -> Tuple[float, List[float]]:
    """(the share of a worker's compute that the updates of the variables on servers take off
    it, per machine the share its server's updates take): a variable in k shards, 1/k of its
    update on each of its servers."""
    off, held = 0.0, [0.0] * cluster.machines
    for name, method in choice.items():
        if method.how == PS:
            off += stats[name].update
            for server in method.servers:
                held[server] += stats[name].update / len(method.servers)
    return min(off, 1.0), held


def pushed_when_ready(var: VariableStats, method: Method) -> bool:
    """Whether each worker sends `var`'s gradient on its own as soon as it is ready, while the
    compute goes on: a dense gradient to a server. A sparse one is summed with its machine's
    others first (local aggregation); an allreduce waits for every worker, and Horovod's
    overlap nothing measurable of the compute on the benchmark (cnn's predicted without it)."""
    return method.how == PS and not var.sparse


def compute_and_pushes(compute: float, pushes: Sequence[Tuple[float, float]],
                       off: float = 0.0, server_seconds: float = 0.0) -> float:
    """Seconds of the compute and of a link direction's pushes after the pulls, then of the
    servers' updates: each push, (the share of the compute done when it can go, its seconds on
    the link), goes in that order as soon as the link is free; those that wait for the
    compute's end (1.0) follow it. `off`: the share of the compute that the servers' updates
    take off a worker, which ends that much sooner (its gradients are ready when they were);
    `server_seconds`: the busiest server's updates, after the pushes (server_updates)."""
    return max(_compute_and_link(compute, pushes, off)) + server_seconds


def _compute_and_link(compute: float, pushes: Sequence[Tuple[float, float]], off: float
                      ) -> Tuple[float, float]:
    """(when a worker's compute ends, when the link's last push ends): compute_and_pushes."""
    worker = compute * (1 - off)
    link = 0.0
    for ready, seconds in sorted(pushes):
        link = max(link, min(ready * compute, worker)) + seconds
    return worker, link


def waits(choice: Dict[str, Method], stats: Dict[str, VariableStats], cluster: Shape,
          links: Links, hierarchical_allreduce: bool = False) -> float:
    """Seconds of a step's communication that are not its bytes: a latency for each message
    in sequence on the busiest link, and, with allreduces in machine stages, the two more
    cycles of Horovod's background thread they wait for."""
    return (_rounds(choice, stats, cluster) * links.latency
            + (MACHINE_STAGES_SECONDS if _staged(choice, hierarchical_allreduce) else 0.0))


def _rounds(choice: Dict[str, Method], stats: Dict[str, VariableStats], cluster: Shape) -> int:
    return max((messages(stats[name], method, cluster) for name, method in choice.items()),
               default=0)


def _staged(choice: Dict[str, Method], hierarchical_allreduce: bool) -> bool:
    return hierarchical_allreduce and any(m.how == ALLREDUCE for m in choice.values())


def no_traffic(cluster: Shape) -> Tuple[Traffic, Traffic]:
    return tuple([[0.0, 0.0] for _ in range(cluster.machines)] for _ in range(2))


def added(phases: Tuple[Traffic, Traffic], more: Tuple[Traffic, Traffic]
           ) -> Tuple[Traffic, Traffic]:
    return tuple([[a[0] + b[0], a[1] + b[1]] for a, b in zip(phase, add)]
                 for phase, add in zip(phases, more))


def busiest_link(phase: Traffic) -> Tuple[int, int]:
    """(machine, 0 for sending or 1 for receiving) of a phase's busiest link direction."""
    return max(((machine, direction) for machine in range(len(phase)) for direction in (0, 1)),
               key=lambda link: phase[link[0]][link[1]])


def busiest_bytes(phases: Sequence[Traffic]) -> float:
    """The bytes a step's phases cost in sequence: each phase's busiest link direction."""
    return sum(max((max(link) for link in phase), default=0.0) for phase in phases)


def communication(phases: Tuple[Traffic, Traffic], rounds: int, links: Links) -> float:
    return busiest_bytes(phases) / links.bandwidth + rounds * links.latency
