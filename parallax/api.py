"""The two calls a user makes: `shard(dataset)` and `get_runner(graph, resources, config)`."""
from __future__ import annotations

import functools
import itertools
import logging
import os
import sys
import time
from typing import Optional, Tuple

import tensorflow as tf

from parallax import cost, launch
from parallax.analysis import GraphAnalysis, analyze
from parallax.auto import Decision, decide
from parallax.partitioner import check_counts
from parallax.profile import Profiler
from parallax.checkpoint import Checkpointer
from parallax.cluster import Cluster
from parallax.config import Config
from parallax.errors import ParallaxError
from parallax.graph_copy import GraphMap, copy_graph
from parallax.grpc_server import start_server
from parallax.passes import transform
from parallax.passes.allreduce import BROADCAST_COLLECTION
from parallax.passes.ps import SERVER_STATE_COLLECTION
from parallax.passes.split_variables import split_variables, splittable_in_turn
from parallax.plan import (Sync, describe, effective_run_option, make_plan, uses_horovod,
                           validate)
from parallax.session import ParallaxRunner
from runner.control import start_heartbeat
from runner.output import PAST_STARTUP

log = logging.getLogger("parallax")
_run_indices = itertools.count()  # this process's get_runner calls: each gets fresh state


def shard(dataset):
    """This worker's disjoint share of `dataset`: every num_workers-th element from its id.
    `dataset` is a tf.data.Dataset, or a list of file names (for a queue-based pipeline's
    tf.compat.v1.train.string_input_producer), which is shared out whole files each."""
    num_workers, worker_id = launch.worker_count_and_id()
    if isinstance(dataset, tf.data.Dataset):
        return dataset if num_workers == 1 else dataset.shard(num_workers, worker_id)
    if isinstance(dataset, (list, tuple)) and all(isinstance(f, (str, bytes)) for f in dataset):
        files = list(dataset)[worker_id::num_workers]
        if not files:
            raise ParallaxError(f"parallax.shard: {len(dataset)} files for {num_workers} "
                                f"workers leave worker {worker_id} none; split the data in at "
                                "least as many files as workers, or use tf.data")
        return files
    raise ParallaxError(
        f"parallax.shard takes a tf.data.Dataset or a list of file names, got "
        f"{type(dataset).__name__}: for other input, use tf.data, shard in the graph with "
        "parallax.num_shards_and_shard_id(), or feed each worker its rows (README, Porting)")


def num_workers() -> int:
    """The number of workers of the job, for graph code that counts in steps of the combined
    batch (decay_steps); 1 in the driver, which builds the graph only to analyze it."""
    return launch.worker_count_and_id()[0]


def num_shards_and_shard_id() -> Tuple[tf.Tensor, tf.Tensor]:
    """The number of workers and this worker's id, as int64 tensors of the default graph: for
    input code in the graph that shards by itself (a filename queue, `Dataset.shard`,
    arithmetic on a global index). (1, 0) in the driver and outside a job."""
    num_workers_, worker_id = launch.worker_count_and_id()
    return (tf.constant(num_workers_, tf.int64, name="parallax_num_shards"),
            tf.constant(worker_id, tf.int64, name="parallax_shard_id"))


def get_runner(graph: tf.Graph, resources: str, config: Optional[Config] = None):
    """Train `graph` (built for one device) data-parallel on `resources`.

    In the process the user started (the driver) this launches the job's processes, waits for
    them and exits with their status: it does not return. In a worker it returns a
    ParallaxRunner whose `run` takes the original graph's fetches.
    """
    config = config or Config()
    if not isinstance(graph, tf.Graph):
        raise ParallaxError(f"get_runner needs a tf.Graph, got {type(graph).__name__}")
    analysis = analyze(graph)  # in the driver too, so a bad graph fails before any launch
    if launch.role() == "driver":
        decision = None
        if _decides(config):
            shape, links, within = launch.probe_cluster(resources, config)
            decision = decide(graph, analysis, shape, cost.Links(**links) if links else None,
                              config.run_option, config.search_partitions,
                              cost.Links(**within) if within else None,
                              config.hierarchical_allreduce, config.split_variables)
        planned = analysis  # the workers' analysis: of the copy they split, if they split
        if decision is not None and decision.splits:
            planned = _split_copy(graph, analysis, decision)[1]
        validate(planned, config, decision)
        run_option = effective_run_option(config.run_option, planned, decision)
        launch.run_driver(resources, config, run_option,
                          uses_horovod(run_option, planned, config.sync_batch_norm),
                          decision.to_env() if decision else {})
    return _start_worker(graph, analysis, config)


def _split_copy(graph: tf.Graph, analysis: GraphAnalysis, decision: Optional[Decision],
                decided: bool = True) -> Tuple[tf.Graph, GraphAnalysis]:
    """A copy of `graph` to transform, with the variables the decision splits in row shards
    (passes/split_variables.py), and its analysis (`analysis`, when it splits none). A graph
    the driver did not decide for (`decided` False: built after the script's first
    get_runner, an evaluation graph) splits those it can in turn, as the driver chose them
    (split_variables.splittable_in_turn), and keeps the others whole."""
    copy = copy_graph(graph)
    splits = dict(decision.splits) if decision is not None else {}
    if not decided:
        splits = {name: splits[name] for name in splittable_in_turn(copy, list(splits))[0]}
    if not splits:
        return copy, analysis
    copy = split_variables(copy, splits)
    return copy, analyze(copy)


def _decides(config: Config) -> bool:
    """Whether the driver measures and decides before launching (parallax/auto.py)."""
    return config.run_option == "AUTO" or config.search_partitions or bool(
        config.split_variables)


def _start_worker(user_graph, analysis, config) -> ParallaxRunner:
    heartbeat = start_heartbeat()  # None unless a driver started this process
    if heartbeat is not None:
        _past_startup()
    if not log.handlers and not logging.getLogger().handlers:
        # A worker is a process Parallax started: its INFO lines (the plan) are the job's
        # output, unless the user's script configured logging itself.
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("parallax: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    cluster = Cluster.from_env()
    decision = Decision.from_env() if _decides(config) else None
    if decision is not None:
        check_counts(user_graph, decision.partitions)
    run_index = next(_run_indices)
    graph, analysis = _split_copy(user_graph, analysis, decision, decided=run_index == 0)
    plan = make_plan(analysis, config, cluster, run_index=run_index, decision=decision)
    on_servers = [p.variable.name for p in plan.with_sync(Sync.PS)]
    if on_servers and not cluster.has_servers:
        raise ParallaxError(
            f"this graph puts {on_servers[0]!r} on a parameter server, and the job has none: "
            "the driver launched it for the graph of the script's first get_runner, which "
            "needed none. Give every graph of a script the same kinds of variables (sparse "
            "ones too), or use run_option='PS', which always starts servers")
    if plan.uses_horovod:
        from parallax.passes import machine_allreduce  # only jobs with replicas join Horovod

        machine_allreduce.init_horovod(cluster)
    if config.export_graph_path and cluster.is_chief:
        _export_graph(user_graph, config.export_graph_path, "single_device")
    graph = transform(graph, plan)
    if config.export_graph_path:
        _export_graph(graph, config.export_graph_path, f"worker{cluster.worker_id}")
    sess_config = tf.compat.v1.ConfigProto()
    sess_config.CopyFrom(config.sess_config or tf.compat.v1.ConfigProto(allow_soft_placement=True))
    target = ""
    if cluster.has_servers:
        # Each worker talks to the servers and to itself only, never waits for its peers.
        sess_config.device_filters[:] = ["/job:ps", cluster.worker_device()]
        target = _worker_server(cluster, sess_config).target
    session = tf.compat.v1.Session(target, graph=graph, config=sess_config)
    checkpointer = Checkpointer(graph, config.ckpt_config, cluster.is_chief)
    _initialize(session, graph, cluster, checkpointer)
    description = describe(plan)
    if cluster.is_chief:
        log.info("%s", description)
    if heartbeat is not None:
        heartbeat.announce_exit()  # after hvd.init: runs before Horovod's atexit shutdown
    synchronization = {name: p.sync.value for name, p in plan.variables.items()}
    profiler = (Profiler(config.profile_config, cluster.worker_id, graph)
                if config.profile_config else None)
    return ParallaxRunner(GraphMap(user_graph, graph), session, cluster.num_workers,
                          cluster.worker_id, description, checkpointer, analysis.training_writes,
                          heartbeat, synchronization, profiler)


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


@functools.lru_cache(maxsize=None)
def _server_of_process(cluster_json, worker_id, sess_config_bytes):
    return start_server(Cluster.from_json(cluster_json), "worker", worker_id,
                        tf.compat.v1.ConfigProto.FromString(sess_config_bytes))


def _worker_server(cluster, sess_config):
    """This worker's gRPC server: one per process, however many runners it creates (a port
    can be bound once)."""
    return _server_of_process(cluster.to_env(), cluster.worker_id,
                              sess_config.SerializeToString())


def _initialize(session, graph, cluster, checkpointer) -> None:
    """Every worker initializes its own replicas; the chief initializes what lives on servers,
    or restores it and its replicas from the latest checkpoint, while the others wait for it;
    then replicas take worker 0's values."""
    with graph.as_default():
        variables = tf.compat.v1.global_variables() + tf.compat.v1.local_variables()
        on_servers = [v for v in variables if v.op.device.startswith("/job:ps")]
        replicas = [v for v in variables if not v.op.device.startswith("/job:ps")]
        # The chief initializes the runner's own server state (mirrors) last: once it is
        # there, the others know the model's variables are ready.
        ready_signal = graph.get_collection(SERVER_STATE_COLLECTION)
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
    session.run(graph.get_collection(BROADCAST_COLLECTION))
