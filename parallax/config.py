"""A Parallax job's configuration: `Config`, the user's one object, and the parts each stage
receives of it (who reads what): `PlanOptions` for planning, `RuntimeOptions` for the worker,
`runner.settings.Settings` for launching and supervising the processes."""
from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Optional, Sequence, Set

from parallax.errors import ConfigError
from runner.settings import SettingError, Settings

# 'MPI' is the paper's name for the AllReduce path; both spell the same mode.
RUN_OPTIONS = {"AR": "AR", "MPI": "AR", "PS": "PS", "HYBRID": "HYBRID", "AUTO": "AUTO"}


@dataclasses.dataclass
class PSConfig:
    """Options of the parameter-server path.

    local_aggregation: sum the sparse gradients of the workers of one machine on that machine,
        so one gradient per variable per machine crosses to the owning server, not one per worker.
    post_aggregation_placement: place the ops between a gradient's aggregate and its
        update (deduplication, norms, clipping) beside their inputs on the servers, a shared one
        on the first server; off, the chief computes them, the aggregates travelling to it and
        back.
    boundary_between_workers_and_servers: move light ops (slice, gather, cast, reshape...) at
        the edge between a server and a worker to the side where fewer bytes cross machines.
    defer_gradient_free_server_work: an update's work on a server that does not need the
        step's gradient (Adam's decay of its slots over the whole table) waits for the
        gradient's aggregate, running while the workers communicate instead of while they
        compute on the cores the server shares (passes/defer_server_work.py).
    server_memory_bytes: the most bytes of variables (with their optimizer slots) one server
        may hold; the driver refuses a plan that puts more on one, naming it and the largest
        variable there (a dynamic embedding's part is capacity/servers rows). None: no limit.
    """

    local_aggregation: bool = True
    post_aggregation_placement: bool = True
    boundary_between_workers_and_servers: bool = True
    defer_gradient_free_server_work: bool = True
    server_memory_bytes: Optional[int] = None


@dataclasses.dataclass
class CheckpointConfig:
    """Checkpoints written by the chief: every variable (replicated ones and those on servers,
    with optimizer slots and global_step). A job started again with the same ckpt_dir resumes
    from the latest one. Saves every save_ckpt_steps global steps and/or save_ckpt_secs seconds,
    and when the runner is closed."""

    ckpt_dir: Optional[str] = None
    save_ckpt_steps: Optional[int] = None
    save_ckpt_secs: Optional[float] = None


@dataclasses.dataclass
class ProfileConfig:
    """Timelines of chosen runs (runtime/profile.py). profile_dir: where the traces and
    phases.jsonl go (created). profile_steps: which runs, counted from 1 in each worker's
    runner.run calls. profile_workers: which workers (ids)."""

    profile_dir: str
    profile_steps: Sequence[int] = (10,)
    profile_workers: Sequence[int] = (0,)

    def __post_init__(self):
        if not self.profile_dir:
            raise ConfigError("profile_config", "profile_config=ProfileConfig(...) needs a "
                              "profile_dir")
        if not all(isinstance(s, int) and s >= 1 for s in self.profile_steps):
            raise ConfigError("profile_config", f"profile_config's profile_steps are runs "
                              f"counted from 1, got {list(self.profile_steps)!r}")


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    """What planning reads (planning/): how each variable is synchronized and where it lives.

    run_option:
        'HYBRID' (default): dense variables are replicated and allreduced, sparse ones live on
            parameter servers. A model with only dense variables runs as 'AR' and one with only
            sparse variables as 'PS'.
        'AR' (alias 'MPI', the paper's name): every variable is replicated; dense gradients are
            allreduced and sparse ones allgathered.
        'PS': every variable lives on the parameter servers (one per machine).
        'AUTO': per variable, what the cost model (planning/cost.py) predicts to be fastest,
            from the rows its gradients have on the first batches (measured by the driver
            before launching) and the cluster's shape: allreduce for dense gradients and for
            sparse ones that are nearly dense, allgather, or a parameter server.
    average_dense / average_sparse: aggregate gradients as the mean over workers (as
        single-device training on the combined batch does for a mean loss) or as the sum.
    ps_config: options of the parameter-server path (PSConfig); the search rates the ones
        that run.
    hierarchical_allreduce: allreduce dense gradients in machine stages
        (rewriting/machine_allreduce.py): summed within each machine, then across machines
        with each of a machine's G workers carrying 1/G of the sum, then shared within the
        machine. A machine's link carries 2w(H-1)/H bytes of a w-byte gradient instead of a
        ring's 2w(N-1)/N, for three collectives in sequence instead of one. Possible where
        every machine has the same number of workers, more than one, on more than one machine.
        None (default): where the cost model predicts it faster for the bytes the plan
        allreduces; True: wherever possible; False: one ring over all workers.
    split_variables: whether sparse variables the user did not partition are split in row
        shards over the servers (rewriting/split_variables.py): None (default), where the cost
        model predicts it faster under AUTO or search_partitions; True, every one a server
        holds that can be split, in one shard a machine; False, none.
    sync_batch_norm: batch statistics (tf.nn.moments over the batch axis, Keras's
        BatchNormalization, fused batch norm kernels in training mode) of the combined batch of
        all workers, forward and backward, so a batch-norm model trains as on one device. None
        (default): wherever the graph has them; False: each worker normalizes its own batch
        (the driver warns, naming the ops).
    search_partitions: the number of shards of each variable made by
        parallax.get_partitioner(min_partitions) is the one the cost model predicts fastest
        (from min_partitions to the number of machines), measured by the driver as for AUTO;
        off, min_partitions.
    sync: False for asynchronous training (the paper's PS architecture): each worker applies
        its own gradients to the variables on parameter servers as they arrive, without
        aggregation or steps in common; dense variables of HYBRID keep their allreduce, in
        step. Needs parameter servers (PS, HYBRID).
    trial_steps: under AUTO, when the cost model chooses parameter servers or the graph has
        sparse variables, the job first trains this many steps with each plan it times (the
        run options' rules where they differ from its choice): each plan warms up on a third
        of them, untimed, and is timed on the rest in two turns, the second pass in the
        reverse order (planning/trial_policy.py), and the job keeps the plan whose steps were
        fastest on the cluster. They are real training steps: each plan goes on from the last
        one's variables and input, as one device would. 0 keeps the cost model's choice untried. A graph whose
        step draws random numbers (dropout) or reads a queue-based input is not tried: a new
        session would start those over.
    trial_margin: a rule's plan predicted slower than the cost model's choice by more than
        this fraction is not timed (it cannot win however the model errs); None: the model's
        measured error (planning/proposal.py, TRUSTED_MARGIN); float('inf') times every one.
    collectives: the library of the allreduce, allgather and broadcast among the workers:
        'horovod' (Horovod's gloo on CPU; it builds against TensorFlow 2.18 and older) or
        'tensorflow' (TensorFlow's own collective ops, over a gRPC server on each worker).
        None: Horovod where it is installed, else TensorFlow's.
    """

    run_option: str = "HYBRID"
    average_dense: bool = True
    average_sparse: bool = True
    ps_config: PSConfig = dataclasses.field(default_factory=PSConfig)
    hierarchical_allreduce: Optional[bool] = None
    split_variables: Optional[bool] = None
    sync_batch_norm: Optional[bool] = None
    search_partitions: bool = False
    sync: bool = True
    trial_steps: int = 30
    trial_margin: Optional[float] = None
    collectives: Optional[str] = None

    def __post_init__(self):
        if self.collectives not in (None, "horovod", "tensorflow"):
            raise ConfigError("collectives", f"unknown collectives {self.collectives!r}: use "
                              "'horovod', 'tensorflow' or None (Horovod where it is installed)")
        option = str(self.run_option).upper()
        if option not in RUN_OPTIONS:
            raise ConfigError("run_option", f"unknown run_option {self.run_option!r}: use one "
                              f"of {sorted(RUN_OPTIONS)} ('MPI' is the paper's name for 'AR')")
        object.__setattr__(self, "run_option", RUN_OPTIONS[option])
        if not self.sync and self.run_option in ("AUTO", "AR"):
            # AUTO may choose no server at all (allreduce, allgather), which depends on the
            # links the driver measures: refused whatever it would choose.
            raise ConfigError(
                "sync", f"sync=False trains the variables on parameter servers asynchronously, "
                f"and run_option={self.run_option!r} "
                + ("has none" if self.run_option == "AR" else
                   "chooses synchronous methods too (allreduce, allgather)")
                + ": use run_option='HYBRID' or 'PS', or train synchronously")
        if not isinstance(self.trial_steps, int) or self.trial_steps < 0 or (
                0 < self.trial_steps < 3):
            raise ConfigError("trial_steps", f"trial_steps must be 0 (no trials) or at least 3 "
                              f"(a third to warm up, then three timed turns), got "
                              f"{self.trial_steps!r}")
        if self.trial_margin is not None and (
                isinstance(self.trial_margin, bool)
                or not isinstance(self.trial_margin, (int, float)) or not self.trial_margin >= 0):
            raise ConfigError("trial_margin", f"trial_margin must be a fraction >= 0 (None: the "
                              f"model's measured error), got {self.trial_margin!r}")
        if not isinstance(self.ps_config, PSConfig):
            raise ConfigError("ps_config",
                              f"ps_config must be a parallax.PSConfig, got {self.ps_config!r}")
        limit = self.ps_config.server_memory_bytes
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or limit <= 0):
            raise ConfigError("ps_config", "PSConfig(server_memory_bytes=...) must be a "
                              f"number of bytes > 0 (None: no limit), got {limit!r}")

    @property
    def decides(self) -> bool:
        """Whether the driver measures and searches before planning (planning/planner.py)."""
        return self.run_option == "AUTO" or self.search_partitions or bool(self.split_variables)


@dataclasses.dataclass(frozen=True)
class RuntimeOptions:
    """What a worker reads when it runs its plan (worker.py, runtime/).

    sess_config: a tf.compat.v1.ConfigProto for each worker's session (soft placement is
        turned on when not given, so a graph pinned to '/gpu:0' also runs on a CPU worker).
    ckpt_config: checkpoints (CheckpointConfig).
    profile_config: a parallax.ProfileConfig(profile_dir, profile_steps, profile_workers): a
        Chrome trace of those runs on those workers, and how long each spent in each phase
        (input, pull, push, server, allreduce, wait_for_chief, compute) in phases.jsonl.
    export_graph_path: a folder where each worker writes the graph it runs, rewritten
        (workerN.pbtxt, and a TensorBoard event file in the folder workerN), and the chief the
        single-device graph it was given (single_device.pbtxt, single_device/).
    warn_unsharded_input: at its first training step each worker reports a digest of what
        it read (tf.data, input queues, fed data; not settings such as a fed rate), and when
        every worker read the same, the driver says so once: a dataset nobody sharded trains
        on N copies of one batch. False for jobs that mean it.
    """

    sess_config: Optional[object] = None
    ckpt_config: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    profile_config: Optional[ProfileConfig] = None
    export_graph_path: Optional[str] = None
    warn_unsharded_input: bool = True


def _fields(part) -> Set[str]:
    return {field.name for field in dataclasses.fields(part)}


def _options_of(*parts):
    """Makes a class the dataclass of every part's fields, with their defaults and their
    docstrings: an option is declared once, in the part of the stage that reads it."""
    def build(cls):
        cls.__annotations__ = {}
        for part in parts:
            types = typing.get_type_hints(part)  # evaluated where the part's names are known
            for field in dataclasses.fields(part):
                cls.__annotations__[field.name] = types[field.name]
                setattr(cls, field.name, dataclasses.field(
                    default=field.default, default_factory=field.default_factory))
        cls.__doc__ = "\n\n".join([inspect.cleandoc(cls.__doc__)] + [
            f"{part.__module__}.{part.__name__}: {inspect.cleandoc(part.__doc__)}"
            for part in parts])
        return dataclasses.dataclass(cls)
    return build


@_options_of(PlanOptions, RuntimeOptions, Settings)
class Config:
    """How a job is distributed and run: the user's one object. Its keywords are those of the
    parts each stage receives (plan_options, runtime_options, launch_settings), documented
    below, part by part. A restarted job (max_restarts) resumes from its latest checkpoint, so
    it needs ckpt_config.ckpt_dir."""

    def __post_init__(self):
        self.run_option = self.plan_options.run_option  # checked, and 'MPI' spelled 'AR'
        if self.launch_settings.max_restarts and not self.ckpt_config.ckpt_dir:
            raise ConfigError("max_restarts", f"max_restarts={self.max_restarts} needs "
                              "ckpt_config=CheckpointConfig(ckpt_dir=...): a restarted job "
                              "resumes from its latest checkpoint")

    def _part(self, part):
        return part(**{name: getattr(self, name) for name in _fields(part)})

    @property
    def plan_options(self) -> PlanOptions:
        return self._part(PlanOptions)

    @property
    def runtime_options(self) -> RuntimeOptions:
        return self._part(RuntimeOptions)

    @property
    def launch_settings(self) -> Settings:
        try:
            return self._part(Settings)
        except SettingError as error:
            raise ConfigError(error.option, str(error)) from error
