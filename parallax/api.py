"""The two calls a user makes: `shard(dataset)` and `get_runner(graph, resources, config)`."""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Tuple, Union

import tensorflow as tf

from parallax import contracts, driver, worker
from parallax.config import CheckpointConfig, Config
from parallax.errors import ParallaxError
from parallax.planning.analysis import analyze
from parallax.runtime import combined_batch, monitored, recording
from runner import slurm
from runner.heartbeat import Heartbeat

# This process's, once it is a worker, by its cluster (the worker's id in it): one, but for
# jobs whose workers are threads of one process (tests/in_process.py).
_worker_processes: Dict[str, worker.WorkerProcess] = {}


def _process() -> worker.WorkerProcess:
    """The state of this worker process that outlives a get_runner call (worker.py), made at
    the script's first Parallax call: from then on the driver hears from the process."""
    identity = contracts.read_cluster().to_env()
    if identity not in _worker_processes:
        _worker_processes[identity] = worker.WorkerProcess(Heartbeat.from_env())
    return _worker_processes[identity]


def _count_and_id() -> Tuple[int, int]:
    if contracts.role() == "worker":
        _process()
    return worker.count_and_id()


def shard(dataset):
    """This worker's disjoint share of `dataset`: every num_workers-th element from its id.
    `dataset` is a tf.data.Dataset, or a list of file names (for a queue-based pipeline's
    tf.compat.v1.train.string_input_producer), which is shared out whole files each."""
    num_workers, worker_id = _count_and_id()
    if isinstance(dataset, tf.data.Dataset):
        # A job resumed on another number of workers reads on where the combined batches of
        # the checkpoint's job ended (runtime/input_position.py).
        read = contracts.read_input_skip()
        dataset = dataset.skip(read) if read else dataset
        if num_workers == 1:
            return dataset
        dataset = dataset.shard(num_workers, worker_id)
        if _one_device_run(contracts.read_verify_run()):
            combined_batch.combine_fixed_batches(dataset, num_workers)
        return dataset
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
    return _count_and_id()[0]


def num_shards_and_shard_id() -> Tuple[tf.Tensor, tf.Tensor]:
    """The number of workers and this worker's id, as int64 tensors of the default graph: for
    input code in the graph that shards by itself (a filename queue, `Dataset.shard`,
    arithmetic on a global index). (1, 0) in the driver and outside a job."""
    num_workers_, worker_id = _count_and_id()
    return (tf.constant(num_workers_, tf.int64, name="parallax_num_shards"),
            tf.constant(worker_id, tf.int64, name="parallax_shard_id"))


def get_runner(graph: tf.Graph, resources: Optional[str] = None,
               config: Optional[Config] = None):
    """Train `graph` (built for one device) data-parallel on `resources`: a resource file, an
    inline string, or "slurm" (the Slurm allocation the script runs in, also when no resources
    are given inside one).

    In the process the user started (the driver) this plans the job, launches its processes,
    waits for them and exits with their status: it does not return. In a worker it returns a
    ParallaxRunner whose `run` takes the original graph's fetches.
    """
    config = config or Config()
    if not isinstance(graph, tf.Graph):
        raise ParallaxError(f"get_runner needs a tf.Graph, got {type(graph).__name__}")
    analysis = analyze(graph)  # in the driver too, so a bad graph fails before any launch
    query = contracts.read_plan_query()
    if query is not None and contracts.role() == "driver":
        return driver.answer(graph, analysis, config, query)
    resources = _default_resources(resources)
    verify_run = contracts.read_verify_run()
    resources, config = _verifying(resources, config, verify_run)
    if _one_device_run(verify_run):
        return recording.ReplayRunner(graph, analysis, verify_run)
    if contracts.role() == "driver":
        driver.run(graph, analysis, resources, config)
    return worker.start(_process(), graph, analysis, config.plan_options,
                        config.runtime_options)


def _one_device_run(run: Optional[contracts.VerifyRun]) -> bool:
    """Whether this process is parallax.verify's one-device run of the script."""
    return (run is not None and run.phase == contracts.ONE_DEVICE
            and contracts.role() == "driver")


def _default_resources(resources: Optional[str]) -> str:
    if resources is not None:
        return resources
    if slurm.in_allocation():
        return slurm.SLURM
    raise ParallaxError("get_runner needs resources (a resource file, or a string such as "
                        "'localhost:0,1'); only inside a Slurm allocation do they default to "
                        "'slurm'")


def _verifying(resources: str, config: Config, run: Optional[contracts.VerifyRun]
               ) -> Tuple[str, Config]:
    """The resources and config of the script's job, as parallax.verify's `run` of it runs
    it (if it does): on verify's resources, writing no checkpoint."""
    if run is not None:
        return run.resources or resources, dataclasses.replace(
            config, ckpt_config=CheckpointConfig(), max_restarts=0)
    return resources, config


def MonitoredTrainingSession(  # noqa: N802  pylint: disable=invalid-name  (TensorFlow's name)
        resources: Optional[str] = None,
        config: Union[Config, tf.compat.v1.ConfigProto, None] = None, **arguments):
    """tf.compat.v1.train.MonitoredTrainingSession on the default graph, trained by Parallax on
    `resources`: TensorFlow's arguments (checkpoint_dir, scaffold, hooks, chief_only_hooks,
    save_checkpoint_steps/secs, save_summaries_steps/secs, log_step_count_steps,
    stop_grace_period_secs, summary_dir, save_graph_def) and hooks, as TensorFlow runs them;
    chief-only hooks run on the chief; when a hook asks one worker to stop, every worker stops
    after the same step. `config`: a parallax.Config, or TensorFlow's ConfigProto as a script
    gives it (each worker's session config, Config(sess_config=...)). In the driver it launches
    the job and does not return, as get_runner."""
    unknown = set(arguments) - monitored.ARGUMENTS
    if unknown:
        raise ParallaxError(
            f"parallax.MonitoredTrainingSession got {sorted(unknown)}: it takes TensorFlow's "
            f"arguments {sorted(monitored.ARGUMENTS)} (master and is_chief are Parallax's to "
            "set: the job's resources)")
    if isinstance(config, tf.compat.v1.ConfigProto):
        config = Config(sess_config=config)
    config = config or Config()
    graph = tf.compat.v1.get_default_graph()
    analysis = analyze(graph)
    verify_run = contracts.read_verify_run()
    resources, config = _verifying(_default_resources(resources), config, verify_run)
    if verify_run is not None:  # the user's checkpoints and summaries stay as they were
        arguments.update(save_checkpoint_steps=None, save_checkpoint_secs=None,
                         save_summaries_steps=None, save_summaries_secs=None)
    if _one_device_run(verify_run):
        return monitored.monitored_session(
            recording.ReplayRunner(graph, analysis, verify_run), **arguments)
    if contracts.role() == "driver":
        driver.run(graph, analysis, resources, config)
    process = _process()
    runner = worker.start(process, graph, analysis, config.plan_options, config.runtime_options,
                          needs_collectives=True)
    return monitored.monitored_session(
        runner, any_worker_stops=process.collectives.any_worker("parallax_stop_together"),
        chief_says=monitored.chief_text(process.collectives), **arguments)
