"""Every hand-off between the job's processes, and between the passes and the runtime, each
with a typed writer and a typed reader.

- The environment the driver writes for each process it starts. A worker learns from it its
  role, the cluster and its identity in it, the plan, and the shards the plan gives
  parallax.get_partitioner's calls (read while the script builds its graph, before get_runner).
- Typed values as text (`to_wire`/`from_wire`, `to_text`/`from_text`): the one converter of
  the plan the driver sends every worker, and of the answer of `python -m parallax.plan`.
- The graph collections: the gradients capture records while the script builds its graph
  (which travel with it into each copy), the partitioner's calls, the split of variables, and
  what the passes leave in a worker's copy for the passes after them and for the runtime (the
  aggregates, the step's tokens and cuts, the broadcast, the server state).
"""
from __future__ import annotations

import base64
import contextlib
import contextvars
import dataclasses
import enum
import functools
import json
import os
import types
import typing
import zlib
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

import tensorflow as tf

from parallax.cluster import Cluster
from parallax.errors import ParallaxError

ROLE_ENV = "PARALLAX_ROLE"  # "worker" or "server"; a process without it is a driver
CLUSTER_ENV = "PARALLAX_CLUSTER"  # Cluster.to_env(): the topology, addresses and worker id
SERVER_INDEX_ENV = "PARALLAX_SERVER_INDEX"  # which server a "server" process is
PLAN_ENV = "PARALLAX_PLAN"  # [Plan.to_text()] made once by the driver; AUTO's trials follow
PARTITIONS_ENV = "PARALLAX_PARTITIONS"  # {call: shards} for parallax.get_partitioner's calls


# Where the readers below look: the process's environment, or, for code run in `environment`,
# the one given there (tests/in_process.py runs a job's workers as threads of one process).
_ENVIRONMENT: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "parallax_environment")


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """The readers of this module see `values` over the process's environment, in this
    context (thread) alone."""
    token = _ENVIRONMENT.set({**os.environ, **values})
    try:
        yield
    finally:
        _ENVIRONMENT.reset(token)


def _environ() -> Mapping[str, str]:
    return _ENVIRONMENT.get(os.environ)


# --- Typed values as text: the plan to the workers, the plan command's answer. --------------

# A dataclass field's metadata: not sent, as every process has its own (the analysis' objects);
# it arrives as None.
NOT_SENT = {"sent": False}


def to_wire(value: Any) -> Any:
    """`value` as JSON holds it: a dataclass as an object of its fields in their order, but the
    NOT_SENT ones and those at their default of None (from_wire gives them the default again);
    an enum as its value; a tuple (a NamedTuple too) as a list."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: to_wire(getattr(value, field.name))
                for field in dataclasses.fields(value) if field.metadata.get("sent", True)
                and not (field.default is None and getattr(value, field.name) is None)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {key: to_wire(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_wire(item) for item in value]
    return value


def from_wire(kind: Any, data: Any) -> Any:
    """What to_wire wrote, as `kind` again: a dataclass, a NamedTuple, an enum, or a type hint
    of them (Optional, List, Tuple, Dict with str keys)."""
    origin, arguments = typing.get_origin(kind), typing.get_args(kind)
    if data is None:
        return None
    if origin in (typing.Union, types.UnionType):
        return from_wire(next(a for a in arguments if a is not type(None)), data)
    if origin is dict:
        return {key: from_wire(arguments[1], item) for key, item in data.items()}
    if origin is list:
        return [from_wire(arguments[0], item) for item in data]
    if origin is tuple:
        kinds = arguments[:1] * len(data) if arguments[1:] == (Ellipsis,) else arguments
        return tuple(from_wire(item_kind, item) for item_kind, item in zip(kinds, data))
    if dataclasses.is_dataclass(kind):
        hints = _hints(kind)
        return kind(**{field.name: from_wire(hints[field.name], data.get(field.name))
                       for field in dataclasses.fields(kind)
                       if field.name in data or _required(field)})
    if isinstance(kind, type) and issubclass(kind, tuple):  # a NamedTuple
        return kind(*(from_wire(_hints(kind)[name], item)
                      for name, item in zip(kind._fields, data)))
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return kind(data)
    return data


def _required(field: dataclasses.Field) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


@functools.lru_cache(maxsize=None)
def _hints(kind: type) -> Dict[str, Any]:
    return typing.get_type_hints(kind)


def to_text(value: Any) -> str:
    """`value` (to_wire's) as one environment variable carries it: JSON, compressed, so that
    a large graph's plan stays far below the kernel's limit on one variable (128 KiB)."""
    return base64.b64encode(zlib.compress(json.dumps(to_wire(value)).encode(), 9)).decode()


def from_text(kind: Any, text: str) -> Any:
    return from_wire(kind, json.loads(zlib.decompress(base64.b64decode(text))))


DISTRIBUTED, ONE_DEVICE = "distributed", "one device"  # VerifyRun.phase
VERIFY_ENV = "PARALLAX_VERIFY"  # VerifyRun as JSON: `python -m parallax.verify`'s run of a script


@dataclasses.dataclass(frozen=True)
class VerifyRun:
    """What parallax.verify asks of the script it runs: in `phase` "distributed", the job on
    `resources` records its first `steps` training steps in `folder` and stops; in "one device",
    the script's loop replays them on one device (runtime/recording.py)."""
    folder: str
    steps: int
    phase: str  # "distributed" or "one device"
    resources: str = ""  # the distributed run's, in place of the script's
    workers: int = 0  # the one-device run's parallax.num_workers(): the distributed run's
    # the one-device run with each combined batch's examples in reverse order: how far one
    # device is from itself by the order of its sums alone
    reordered: bool = False

    @property
    def one_device_file(self) -> str:
        return os.path.join(self.folder, "one_device_reordered.npz" if self.reordered
                            else "one_device.npz")

    def to_env(self) -> Dict[str, str]:
        return {VERIFY_ENV: json.dumps(dataclasses.asdict(self))}


def read_verify_run() -> Optional[VerifyRun]:
    text = _environ().get(VERIFY_ENV)
    return VerifyRun(**json.loads(text)) if text else None


PLAN_QUERY_ENV = "PARALLAX_PLAN_QUERY"  # PlanQuery as JSON: `python -m parallax.plan`'s run


@dataclasses.dataclass(frozen=True)
class PlanQuery:
    """What `python -m parallax.plan` asks of the script it runs: its get_runner writes what
    each run option's plan would cost on this cluster to the file `out` (JSON) and ends the
    script, launching nothing. With `resources`, the cluster is those machines, probed."""
    out: str
    machines: int = 1
    workers_per_machine: int = 1
    bandwidth: float = 12.5e6  # bytes/s each way between machines
    latency: float = 200e-6  # seconds a message costs besides its bytes
    inside_bandwidth: Optional[float] = None  # within a machine; None: not given
    inside_latency: Optional[float] = None
    cores: int = 0  # of each machine; 0: this machine's
    step: Optional[float] = None  # seconds of one worker's step alone; None: measured here
    batch: Optional[int] = None  # examples of a worker's batch; None: read from the input
    resources: str = ""

    def to_env(self) -> Dict[str, str]:
        return {PLAN_QUERY_ENV: json.dumps(dataclasses.asdict(self))}


def read_plan_query() -> Optional[PlanQuery]:
    text = _environ().get(PLAN_QUERY_ENV)
    return PlanQuery(**json.loads(text)) if text else None


def role() -> str:
    return _environ().get(ROLE_ENV, "driver")


def process_env(role_name: str, cluster: Cluster) -> Dict[str, str]:
    return {ROLE_ENV: role_name, CLUSTER_ENV: cluster.to_env()}


def read_cluster() -> Cluster:
    return Cluster.from_json(_environ()[CLUSTER_ENV])


def server_env(index: int) -> Dict[str, str]:
    return {SERVER_INDEX_ENV: str(index)}


def read_server_index() -> int:
    return int(_environ()[SERVER_INDEX_ENV])


def plan_env(plan_texts: List[str], partitions: List[list]) -> Dict[str, str]:
    """The plan (Plan.to_text), then the plans AUTO times against it (Config.trial_steps), and
    apart from them the partitioner's counts (`partitions`: [call, variable, shards] each),
    which the script's graph code reads without decoding a plan."""
    return {PLAN_ENV: json.dumps(plan_texts),
            PARTITIONS_ENV: json.dumps({str(call): count for call, _, count in partitions})}


def read_plan_texts() -> List[str]:
    if PLAN_ENV not in _environ():
        raise ParallaxError("this worker has no plan from the driver; start the script itself "
                            "(python script.py), whose get_runner plans and launches the workers")
    return json.loads(_environ()[PLAN_ENV])


def read_partition_counts() -> Dict[int, int]:
    """{call: shards} of the driver's plan; empty outside a job, or in the driver."""
    text: Optional[str] = _environ().get(PARTITIONS_ENV)
    return {int(call): count for call, count in json.loads(text).items()} if text else {}


INPUT_SKIP_ENV = "PARALLAX_INPUT_SKIP"  # elements parallax.shard skips: a resume on N' workers


def input_skip_env(elements: Optional[int]) -> Dict[str, str]:
    return {INPUT_SKIP_ENV: str(int(elements))} if elements else {}


def read_input_skip() -> Optional[int]:
    """The elements of parallax.shard's dataset that the job being resumed read, when it ran
    on another number of workers (input_position.Record.elements_read); None otherwise."""
    text = _environ().get(INPUT_SKIP_ENV)
    return None if text is None else int(text)


# --- Graph collections: what capture, the passes and the runtime hand each other. ------------
# JSON strings travel with the graph through a MetaGraphDef (graph_copy.py's copy); ops and
# variables go by name; Python objects are read only in the graph that holds them.

GRADIENTS_COLLECTION = "parallax_gradients"  # GradientRecord.to_json(), capture.py's records
STATISTIC_GRADIENTS_COLLECTION = "parallax_statistic_gradients"  # {"op", "gradient"} JSON
LOSSES_COLLECTION = "parallax_losses"  # tensor names: what capture.py saw differentiated
AGGREGATED_COLLECTION = "parallax_aggregated"  # AggregateRecord JSON, one per aggregate
# JSON records of step synchronization (passes/sync.py): {"token_queues", "restore_queues"} and
# {"write"} in the chief's graph; {"write", "cut"} and {"restore_wait"} in the others'.
STEP_COLLECTION = "parallax_step"
APART_COLLECTION = "parallax_collectives_apart"  # loops of collectives/tensorflow.py
BROADCAST_COLLECTION = "parallax_broadcast"  # ops copying worker 0's initial values
MIRROR_READ_COLLECTION = "parallax_mirror_read"  # other workers' reads of mirror variables
SERVER_STATE_COLLECTION = "parallax_server_state"  # variables the chief initializes last
# PartitionerCall objects in call order, read in the graph the script built (a MetaGraphDef
# drops them: TensorFlow warns that it cannot serialize them).
PARTITIONER_CALLS_COLLECTION = "parallax_partitioner_calls"
TABLES_COLLECTION = "parallax_dynamic_embeddings"  # TableRecord JSON, one per table
TABLE_SIZES_COLLECTION = "parallax_table_sizes"  # {"name", "tensor"} JSON: a part's ids
# Not a str: get_all_collection_keys, hence export_meta_graph (a Saver's meta graph of the
# copy), skips it, as it holds a Python object no MetaGraphDef can.
SPLIT_STATE_COLLECTION = ("parallax_split_state",)


def _decoded(text) -> dict:
    # A collection imported from a MetaGraphDef holds bytes.
    return json.loads(text.decode() if isinstance(text, bytes) else text)


@dataclasses.dataclass(frozen=True)
class GradientRecord:
    """One variable's gradient as autodiff produced it; names are graph element names."""

    variable: str  # the variable's op name (VarHandleOp / VariableV2)
    dense: Optional[str] = None  # tensor name of a dense gradient
    values: Optional[str] = None  # IndexedSlices parts of a sparse gradient
    indices: Optional[str] = None
    dense_shape: Optional[str] = None

    @property
    def is_sparse(self) -> bool:
        return self.values is not None

    def tensor_names(self) -> List[str]:
        return [n for n in (self.dense, self.values, self.indices) if n is not None]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text) -> "GradientRecord":
        return cls(**_decoded(text))


def record_gradient(graph: tf.Graph, record: GradientRecord) -> None:
    """Written by capture.py as autodiff produces each variable's gradient."""
    graph.add_to_collection(GRADIENTS_COLLECTION, record.to_json())


def read_gradients(graph: tf.Graph, unique: bool = True) -> List[GradientRecord]:
    """The gradients recorded in `graph`, in recording order, without repeats unless `unique`
    is False (a rewrite of the list, replace_gradients, keeps it as it is)."""
    records = [GradientRecord.from_json(text)
               for text in graph.get_collection(GRADIENTS_COLLECTION)]
    return list(dict.fromkeys(records)) if unique else records


def replace_gradients(graph: tf.Graph, records: Sequence[GradientRecord]) -> None:
    """The recorded gradients become `records` (split_variables.py: a split variable's
    gradient becomes its shards')."""
    graph.get_collection_ref(GRADIENTS_COLLECTION)[:] = [r.to_json() for r in records]


def record_loss(graph: tf.Graph, tensor: str) -> None:
    """Written by capture.py: a tensor autodiff differentiated (a loss)."""
    if tensor not in read_losses(graph):
        graph.add_to_collection(LOSSES_COLLECTION, tensor)


def read_losses(graph: tf.Graph) -> List[str]:
    return [text.decode() if isinstance(text, bytes) else text
            for text in graph.get_collection(LOSSES_COLLECTION)]


def record_statistic_gradient(graph: tf.Graph, mean_op: str, gradient: str) -> None:
    """Written by capture.py: the gradient autodiff passed into a batch mean's op."""
    graph.add_to_collection(STATISTIC_GRADIENTS_COLLECTION, json.dumps(
        {"op": mean_op, "gradient": gradient}))


def read_statistic_gradients(graph: tf.Graph) -> Dict[str, str]:
    """Mean op name -> the gradient autodiff passed into it (for sync_batch_norm)."""
    pairs = (_decoded(text) for text in graph.get_collection(STATISTIC_GRADIENTS_COLLECTION))
    return {pair["op"]: pair["gradient"] for pair in pairs}


@dataclasses.dataclass(frozen=True)
class AggregateRecord:
    """What a recorded gradient tensor became after aggregation, so the session can hand the
    user the aggregated value when they fetch a gradient, as single-device training would."""

    source: str  # the gradient tensor's name
    aggregated: str  # its aggregate's
    trigger: str  # the op whose run makes this worker take part in the aggregation
    on_server: bool = False  # aggregated on a parameter server: the chief releases the step


def record_aggregated(source: tf.Tensor, aggregated: tf.Tensor,
                      trigger: Optional[tf.Operation] = None, on_server: bool = False) -> None:
    """Note that `aggregated` is what `source` became. `trigger` is the op whose run makes this
    worker take part in the aggregation (its push, when the aggregate is read from elsewhere);
    by default the aggregate's own op. `on_server`: aggregated on a parameter server, where the
    chief's release of the step tells the other workers it is there."""
    record = AggregateRecord(source.name, aggregated.name, (trigger or aggregated.op).name,
                             on_server)
    source.graph.add_to_collection(AGGREGATED_COLLECTION, json.dumps(dataclasses.asdict(record)))


def read_aggregates(graph: tf.Graph) -> List[AggregateRecord]:
    """Every aggregate recorded, in recording order."""
    return [AggregateRecord(**_decoded(text))
            for text in graph.get_collection(AGGREGATED_COLLECTION)]


def read_aggregated(graph: tf.Graph) -> Dict[str, str]:
    """Recorded gradient tensor name -> the name of its aggregate."""
    return {r.source: r.aggregated for r in read_aggregates(graph)}


def read_triggers(graph: tf.Graph) -> Dict[str, str]:
    """Aggregate tensor name -> the op whose run makes this worker take part in it."""
    return {r.aggregated: r.trigger for r in read_aggregates(graph)}


def read_server_aggregates(graph: tf.Graph) -> Set[str]:
    """Names of the aggregate tensors that come from a parameter server."""
    return {r.aggregated for r in read_aggregates(graph) if r.on_server}


@dataclasses.dataclass(frozen=True)
class StepQueues:
    """The chief's queues of step tokens, one per other worker: their handle tensors' names.
    Field names are release_step's `queues` argument."""

    token_queues: Tuple[str, ...]
    restore_queues: Tuple[str, ...]


def record_step_queues(graph: tf.Graph, queues: StepQueues) -> None:
    """Written by synchronize_steps in the chief's graph."""
    graph.add_to_collection(STEP_COLLECTION, json.dumps(
        {"token_queues": list(queues.token_queues),
         "restore_queues": list(queues.restore_queues)}))


def read_step_queues(graph: tf.Graph) -> Optional[StepQueues]:
    """The chief's step queues; None in another worker's graph, or without step
    synchronization."""
    record = next((r for r in _step_records(graph) if "restore_queues" in r), None)
    return None if record is None else StepQueues(tuple(record["token_queues"]),
                                                  tuple(record["restore_queues"]))


def record_server_write(graph: tf.Graph, write: tf.Operation,
                        cut: Optional[tf.Operation] = None) -> None:
    """A server-side update `write`; `cut`, in a worker other than the chief, what replaces it
    there (the wait for the chief to apply it)."""
    record = {"write": write.name} if cut is None else {"write": write.name, "cut": cut.name}
    graph.add_to_collection(STEP_COLLECTION, json.dumps(record))


def read_server_writes(graph: tf.Graph) -> Dict[str, Optional[str]]:
    """Server-side update name -> the cut that replaces it (None in the chief's graph)."""
    return {r["write"]: r.get("cut") for r in _step_records(graph) if "write" in r}


def record_restore_wait(graph: tf.Graph, wait: tf.Operation) -> None:
    """Written in a worker other than the chief: its op waiting for the chief's restore."""
    graph.add_to_collection(STEP_COLLECTION, json.dumps({"restore_wait": wait.name}))


def read_restore_wait(graph: tf.Graph) -> Optional[tf.Operation]:
    """What a worker other than the chief runs to wait for the chief's restore (None in the
    chief's graph, or without step synchronization)."""
    name = next((r["restore_wait"] for r in _step_records(graph) if "restore_wait" in r), None)
    return None if name is None else graph.get_operation_by_name(name)


def _step_records(graph):
    return (_decoded(text) for text in graph.get_collection(STEP_COLLECTION))


def record_apart_loop(loop) -> None:
    """A loop of a collective run apart from the steps (collectives/tensorflow.py), in the
    default graph: its threads (loop.create_threads(session, coord)) are started and stopped
    by the runner, with the graph's queue runners."""
    tf.compat.v1.add_to_collection(APART_COLLECTION, loop)


def read_apart_loops(graph: tf.Graph) -> list:
    return graph.get_collection(APART_COLLECTION)


def record_broadcast(graph: tf.Graph, op: tf.Operation) -> None:
    """Written by broadcast_initial_values: run once, after initialization, by every worker."""
    graph.add_to_collection(BROADCAST_COLLECTION, op)


def read_broadcasts(graph: tf.Graph) -> List[tf.Operation]:
    return graph.get_collection(BROADCAST_COLLECTION)


def record_mirror_read(graph: tf.Graph, read: tf.Operation) -> None:
    """Written by the PS pass in a worker other than the chief: a read of a mirror variable,
    which synchronize_steps makes wait for the step's token."""
    graph.add_to_collection(MIRROR_READ_COLLECTION, read)


def read_mirror_reads(graph: tf.Graph) -> List[tf.Operation]:
    return graph.get_collection(MIRROR_READ_COLLECTION)


def record_server_state(graph: tf.Graph, variable: tf.Variable) -> None:
    """A variable of the runner's own on a server (a mirror, the servers' ready flag), made
    with collections=[]: the chief initializes these last, which tells the other workers the
    model's variables are ready (worker.py)."""
    graph.add_to_collection(SERVER_STATE_COLLECTION, variable)


def read_server_state(graph: tf.Graph) -> List[tf.Variable]:
    return graph.get_collection(SERVER_STATE_COLLECTION)


@dataclasses.dataclass(frozen=True)
class PartitionerCall:
    """One call of a partitioner of parallax.get_partitioner, in the order the graph made them."""

    first_variable: int  # the index its first shard has in GLOBAL_VARIABLES
    min_partitions: int


def record_partitioner_call(graph: tf.Graph, call: PartitionerCall) -> None:
    graph.add_to_collection(PARTITIONER_CALLS_COLLECTION, call)


def read_partitioner_calls(graph: tf.Graph) -> List[PartitionerCall]:
    return graph.get_collection(PARTITIONER_CALLS_COLLECTION)


@dataclasses.dataclass
class TableRecord:
    """A dynamic embedding of the graph (parallax/embeddings/), by its ops' and tensors' names,
    for the analysis, the planner and the rewrite."""
    name: str
    dim: int
    capacity: int
    key_dtype: str
    dtype: str
    variable: str  # the rows' variable's op
    keys: str  # the hash table's op
    initializer: Dict[str, Any]  # embeddings.initial_rows.RowInitializer's fields
    min_count: int = 1  # the steps an id is seen in before it gets a row
    seen: str = ""  # where min_count > 1, the hash table of ids' counts (op)
    # Each lookup's distinct ids, their rows and the step it counts them in (tensor names; no
    # step where min_count is 1), which the rewrite gives out on the servers instead.
    lookups: List[List[str]] = dataclasses.field(default_factory=list)
    # The writes of new ids' first values (ops): from the ids alone, whichever worker writes
    # them, so the analysis does not count them as writes from the batch.
    first_values: List[str] = dataclasses.field(default_factory=list)
    # The keys and their rows (tensor names), which the rewrite reads from the servers' parts
    exported: List[str] = dataclasses.field(default_factory=list)


def record_table(graph: tf.Graph, record: TableRecord) -> None:
    """Add `record`, or replace the one of its table."""
    kept = [text for text in graph.get_collection(TABLES_COLLECTION)
            if _decoded(text)["name"] != record.name]
    graph.get_collection_ref(TABLES_COLLECTION)[:] = kept + [
        json.dumps(dataclasses.asdict(record))]


def read_tables(graph: tf.Graph) -> List[TableRecord]:
    return [TableRecord(**_decoded(text)) for text in graph.get_collection(TABLES_COLLECTION)]


def record_table_size(graph: tf.Graph, name: str, tensor: tf.Tensor) -> None:
    """A scalar the runner reports with each training step (metrics file, progress bar)."""
    graph.add_to_collection(TABLE_SIZES_COLLECTION,
                            json.dumps({"name": name, "tensor": tensor.name}))


def read_table_sizes(graph: tf.Graph) -> Dict[str, str]:
    return {entry["name"]: entry["tensor"] for entry in map(
        _decoded, graph.get_collection(TABLE_SIZES_COLLECTION))}


def record_split_state(graph: tf.Graph, state: Any) -> None:
    """What split_variables.py did to `graph`, for its later rewrites and fetches; it replaces
    any state recorded before."""
    graph.get_collection_ref(SPLIT_STATE_COLLECTION)[:] = [state]


def read_split_state(graph: tf.Graph) -> Any:
    """The state record_split_state recorded in `graph`, or None."""
    states = graph.get_collection(SPLIT_STATE_COLLECTION)
    return states[-1] if states else None
