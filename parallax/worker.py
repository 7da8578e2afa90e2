"""A worker: the process the driver started for one slot. It takes the driver's plan, adds its
identity (its id in the cluster, the servers' addresses), rewrites its own copy of the user's
graph with the plan's passes, and returns the runner of a session of it."""
from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import sys
import time
from typing import List, Optional, Tuple

import tensorflow as tf

from parallax import contracts
from parallax.collectives import create as create_collectives
from parallax.collectives.membership import Membership
from parallax.config import CheckpointConfig, PlanOptions, RuntimeOptions
from parallax.errors import ParallaxError
from parallax.partitioner import check_counts
from parallax.planning.analysis import GraphAnalysis
from parallax.planning.describe import describe
from parallax.planning.measure import input_batch
from parallax.planning.job_plan import Plan, Sync, make_plan
from parallax.rewriting.graph_map import GraphMap
from parallax.rewriting.passes import on_grpc_servers
from parallax.rewriting.pipeline import transform
from parallax.rewriting.split_variables import copy_and_split
from parallax.runtime import recording, trials
from parallax.runtime.checkpoint import Checkpointer
from parallax.runtime.grpc_server import start_server
from parallax.runtime.profile import Profiler
from parallax.runtime.session import ParallaxRunner, install_chief_only_saves
from runner.output import PAST_STARTUP

log = logging.getLogger("parallax")
LEFT_COLLECTIVES = "collectives left: no step of the plan uses them"


class WorkerProcess:
    """What a worker process keeps across the script's get_runner calls: its heartbeat, its
    cluster, the index of its next run (each call's runners get fresh state on the servers),
    and its collectives with its membership in them."""

    def __init__(self, heartbeat):
        self.heartbeat = heartbeat  # None unless a driver started this process
        self.cluster = contracts.read_cluster()
        self._server = None
        self.collectives = create_collectives(self.cluster, self.server)
        self.membership = Membership(self.collectives)
        self.run_indices = itertools.count()

    def server(self, config: Optional[tf.compat.v1.ConfigProto] = None
               ) -> tf.compat.v1.train.Server:
        """This worker's gRPC server, started by the first call (with its `config`, the
        collectives' settings added): one per process, however many runners it creates (a
        port is bound once)."""
        if self._server is None:
            own = tf.compat.v1.ConfigProto()
            if config is not None:
                own.CopyFrom(config)
            self._server = start_server(self.cluster, "worker", self.cluster.worker_id,
                                        self.collectives.configure(own))
        return self._server


def count_and_id() -> Tuple[int, int]:
    """(number of workers, this worker's id); (1, 0) in a process that is not a worker."""
    if contracts.role() != "worker":
        verify_run = contracts.read_verify_run()  # one device on the workers' batches
        return (verify_run.workers, 0) if verify_run and verify_run.workers else (1, 0)
    cluster = contracts.read_cluster()
    return cluster.num_workers, cluster.worker_id


def _worker_plans(user_graph: tf.Graph, analysis: GraphAnalysis, options: PlanOptions,
                  process: WorkerProcess) -> List[Tuple[tf.Graph, GraphAnalysis, Plan]]:
    """The copies of the user's graph to rewrite, their analyses, and the plan for each: the
    driver's, bound to this worker, then those AUTO times against it (runtime/trials.py), each
    with its own copy and its own state on the servers (run_index). A graph the driver never
    saw (one of a later get_runner of the script, an evaluation graph) is planned here, by the
    driver's decisions where they name its variables, else by the run option's rule; so is
    one whose parallax.get_partitioner shards the driver's plan changed (replan_in_workers)."""
    texts = contracts.read_plan_texts()
    decision = Plan.from_text(texts[0]).decision
    if decision is not None:
        check_counts(user_graph, decision.partitions)
    splits = decision.splits if decision is not None else {}
    cluster = process.cluster
    run_index = next(process.run_indices)
    if run_index:
        graph, planned = copy_and_split(user_graph, analysis, splits, planned=False)
        return [(graph, planned, make_plan(planned, options, cluster, run_index=run_index,
                                           decision=decision))]
    plans = []
    for index, text in enumerate(texts):
        graph, planned = copy_and_split(user_graph, analysis, splits)
        plan = Plan.from_text(text)
        index = index and next(process.run_indices)  # the first plan has this call's index
        if plan.replan_in_workers:
            plan = make_plan(planned, options, cluster, run_index=index, decision=plan.decision)
        else:
            plan = dataclasses.replace(plan.bind(planned, cluster), run_index=index)
        plans.append((graph, planned, plan))
    return plans


def start(process: WorkerProcess, user_graph: tf.Graph, analysis: GraphAnalysis,
          options: PlanOptions, runtime: RuntimeOptions, needs_collectives: bool = False
          ) -> ParallaxRunner:
    """The runner of this get_runner call; `options` plan a graph the driver did not and
    choose the trials' policy, `runtime` says how the runner runs; `needs_collectives`: the
    script's agreements use them whatever the plan (a monitored session agrees on stopping
    through them)."""
    _begin_output(process.heartbeat)
    plans = _worker_plans(user_graph, analysis, options, process)
    _check_servers(plans[0][2], process.cluster)
    # Only jobs with replicas join, or that time plans (runtime/trials.py), or whose workers
    # agree on stopping (runtime/monitored.py).
    joins = needs_collectives or len(plans) > 1 or any(p.uses_collectives for _, _, p in plans)
    if joins:
        process.membership.join(any(p.hierarchical_allreduce for _, _, p in plans))
    if runtime.export_graph_path and process.cluster.is_chief:
        _export_graph(user_graph, runtime.export_graph_path, "single_device")
    runners, build_seconds = _runners(user_graph, plans, runtime, process)
    if process.cluster.is_chief:
        log.info("%s", runners[0].describe())  # the cost model's choice
    _announce_exit(process.heartbeat)
    if len(runners) == 1:
        if joins:
            _settle(process, plans[0][2], needs_collectives)
        return runners[0]
    return _trial_runner(process, user_graph, plans, runners, build_seconds, options, runtime,
                         needs_collectives)


def _begin_output(heartbeat) -> None:
    """What the worker prints from here on is its own; its INFO lines (the plan) are the job's
    output, unless the user's script configured logging itself; saver.save(runner, ...) writes
    on the chief alone."""
    if heartbeat is not None:
        _past_startup()
    install_chief_only_saves()
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("parallax: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def _check_servers(plan: Plan, cluster) -> None:
    on_servers = [p.variable.name for p in plan.with_sync(Sync.PS)]
    if on_servers and not cluster.has_servers:
        raise ParallaxError(
            f"this graph puts {on_servers[0]!r} on a parameter server, and the job has none: "
            "the driver launched it for the graph of the script's first get_runner, which "
            "needed none. Give every graph of a script the same kinds of variables (sparse "
            "ones too), or use run_option='PS', which always starts servers")


def _runners(user_graph, plans, runtime: RuntimeOptions, process: WorkerProcess
             ) -> Tuple[List[ParallaxRunner], float]:
    """A runner of each plan (the first restores the latest checkpoint), and the seconds the
    others (AUTO's alternatives) took to build."""
    verify_run = contracts.read_verify_run()
    recorder = (recording.Recorder(verify_run, process.cluster.worker_id)
                if verify_run is not None else None)  # one for all the plans AUTO times
    runners = [_runner(user_graph, *plans[0], runtime, process, recorder, first=True)]
    started = time.perf_counter()
    runners += [_runner(user_graph, *plan, runtime, process, recorder, first=False)
                for plan in plans[1:]]
    return runners, time.perf_counter() - started


def _settle(process: WorkerProcess, plan: Plan, needs_collectives: bool) -> None:
    """Once the runner of `plan` is the one the script trains with: leave the collectives
    unless its steps or another runner of the process use them (joined for AUTO's trials, or
    for the replicas' first broadcast only)."""
    process.membership.keep_for(needs_collectives or plan.steps_use_collectives)
    if process.membership.leave_if_unused() and process.cluster.is_chief:
        log.info("%s", LEFT_COLLECTIVES)


def _trial_runner(process: WorkerProcess, user_graph, plans, runners, build_seconds: float,
                  options: PlanOptions, runtime: RuntimeOptions, needs_collectives: bool
                  ) -> trials.TrialRunner:
    """AUTO's trials of the plans' runners (runtime/trials.py); the plan kept takes the
    checkpoints and settles the collectives."""
    candidates = [trials.Candidate(plan.decision.name, plan.decision.step, runner)
                  for (_, _, plan), runner in zip(plans, runners)]
    cluster = process.cluster

    def kept(runner: trials.TrialRunner, candidate: trials.Candidate) -> None:
        if candidate.runner is not runners[0]:
            candidate.runner.take_checkpointer(_checkpointer(
                candidate.runner.transformed_graph, user_graph, runtime.ckpt_config, cluster))
        _settle(process, plans[runners.index(candidate.runner)][2], needs_collectives)
        if cluster.is_chief:
            log.info("%s", trials.describe_kept(runner, candidate))

    quiet = None
    if not needs_collectives:  # a plan whose steps use none is timed without them
        quiet = trials.Quiet([not plan.steps_use_collectives for _, _, plan in plans],
                             process.membership.leave_if_unused, process.membership.rejoin)
    return trials.TrialRunner(candidates, options.trial_steps,
                              process.collectives.chief_vector("parallax_trials"), kept,
                              build_seconds, quiet)


def _announce_exit(heartbeat) -> None:
    if heartbeat is not None:
        heartbeat.announce_exit()  # after hvd.init: runs before Horovod's atexit shutdown


def _runner(user_graph: tf.Graph, graph: tf.Graph, analysis: GraphAnalysis, plan: Plan,
            runtime: RuntimeOptions, process: WorkerProcess, recorder, first: bool
            ) -> ParallaxRunner:
    """The runner of one plan: its copy rewritten, a session of it, its variables initialized
    (the chief restores the latest checkpoint for the `first` plan: AUTO's trials carry the
    state on to the others)."""
    cluster, heartbeat = process.cluster, process.heartbeat
    graph = transform(graph, plan, process.collectives)
    if runtime.export_graph_path and first:
        _export_graph(graph, runtime.export_graph_path, f"worker{cluster.worker_id}")
    sess_config = tf.compat.v1.ConfigProto()
    sess_config.CopyFrom(runtime.sess_config
                         or tf.compat.v1.ConfigProto(allow_soft_placement=True))
    target = ""
    if on_grpc_servers(plan):
        on_servers = cluster.has_servers and plan.run_option in ("PS", "HYBRID")
        # Each worker talks to the servers and to itself only, never waits for its peers (its
        # collectives find theirs through the group leader). An AR plan AUTO times in a job
        # with servers runs without them.
        sess_config.device_filters[:] = (["/job:ps"] if on_servers else []) + [
            cluster.worker_device()]
        process.collectives.configure(sess_config)
        target = process.server(sess_config).target
    session = tf.compat.v1.Session(target, graph=graph, config=sess_config)
    checkpointer = _checkpointer(graph, user_graph,
                                 runtime.ckpt_config if first else CheckpointConfig(), cluster)
    _initialize(session, graph, cluster, checkpointer, broadcast=first)
    checkpointer.begin(session, resumed=first)
    synchronization = {name: p.sync.value for name, p in plan.variables.items()}
    profiler = (Profiler(runtime.profile_config, cluster.worker_id, graph)
                if runtime.profile_config and first else None)
    description = describe(plan, analysis, contracts.read_tables(user_graph))
    return ParallaxRunner(GraphMap(user_graph, graph), session, cluster.num_workers,
                          cluster.worker_id, description, checkpointer,
                          analysis.training_writes, heartbeat, synchronization, profiler,
                          check_input=runtime.warn_unsharded_input, recorder=recorder)


def _checkpointer(graph: tf.Graph, user_graph: tf.Graph, config: CheckpointConfig,
                  cluster) -> Checkpointer:
    return Checkpointer(graph, user_graph, config, cluster.num_workers, cluster.worker_id,
                        lambda: input_batch(user_graph)[0])


def _export_graph(graph: tf.Graph, path: str, name: str) -> None:
    """`name`.pbtxt and a TensorBoard event file in the folder `name`, under `path`."""
    tf.io.write_graph(graph, path, f"{name}.pbtxt")
    writer = tf.compat.v1.summary.FileWriter(os.path.join(path, name), graph)
    writer.close()


def _past_startup() -> None:
    """Tell the driver that what this worker prints from now on is its own: the lines before
    (the script's top, run by the driver too) are not shown twice."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.write(1, b"\n" + PAST_STARTUP)


def _initialize(session, graph, cluster, checkpointer, broadcast: bool = True) -> None:
    """Every worker initializes its own replicas; the chief initializes what lives on servers,
    or restores it and its replicas from the latest checkpoint, while the others wait for it;
    then replicas take worker 0's values (unless `broadcast` is False: a plan AUTO times later,
    whose replicas take them when the training switches to it)."""
    with graph.as_default():
        variables = tf.compat.v1.global_variables() + tf.compat.v1.local_variables()
        on_servers = [v for v in variables if v.op.device.startswith("/job:ps")]
        replicas = [v for v in variables if not v.op.device.startswith("/job:ps")]
        # The chief initializes the runner's own server state (mirrors) last: once it is
        # there, the others know the model's variables are ready.
        ready_signal = contracts.read_server_state(graph)
        # Every op is built before the first run: a group built later marks its inputs
        # (an attribute), which TensorFlow warns about once a session has run them.
        own = [tf.compat.v1.variables_initializer(replicas), tf.compat.v1.tables_initializer()]
        if cluster.is_chief:
            servers_first = tf.compat.v1.variables_initializer(on_servers)
            signal_last = tf.compat.v1.variables_initializer(ready_signal)
            session.run(own)
            session.run(servers_first)
            checkpointer.restore(session)
            session.run(signal_last)
        else:
            uninitialized = tf.compat.v1.report_uninitialized_variables(on_servers + ready_signal)
            session.run(own)
            while len(session.run(uninitialized)):
                time.sleep(0.2)
    if broadcast:
        session.run(contracts.read_broadcasts(graph))
