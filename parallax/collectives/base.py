"""The one seam between Parallax and a collectives library: what the rewriting passes build
into a worker's graph (allreduce, the allgather of slices, broadcast, within groups of workers
such as machine stages) and what a worker process does with the library (join, leave, and the
small agreements of the monitored session, AUTO's trials and the checkpoint choice). Every call
of a collectives library goes through `Collectives`; the implementations live beside it
(horovod.py, tensorflow.py). One object per worker process holds its membership; the ops it
builds ask nothing of a joined library, so a graph can be rewritten where it never joins (the
driver's AUTO probe, tests)."""
from __future__ import annotations

import abc
from typing import Callable, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from parallax.cluster import Cluster


class Collectives(abc.ABC):
    """A collectives library among the workers of `cluster`."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    def configure(self, config: tf.compat.v1.ConfigProto) -> tf.compat.v1.ConfigProto:
        """`config` (changed in place) for a session or server whose runs hold collectives."""
        return config

    def for_steps(self) -> "Collectives":
        """The collectives to build a runner's steps with (the rewriting passes')."""
        return self

    def session(self, graph: tf.Graph, config=None) -> tf.compat.v1.Session:
        """A session of `graph`, whose runs hold collectives only."""
        return tf.compat.v1.Session(graph=graph, config=config)

    # -- ops in a graph -------------------------------------------------------------------
    @abc.abstractmethod
    def allreduce(self, tensor: tf.Tensor, average: bool,
                  group: Optional[Sequence[int]] = None, name: Optional[str] = None
                  ) -> tf.Tensor:
        """The sum (or mean) of `tensor` over the workers, or over the workers of `group`
        (one of cluster.machine_groups(), available once joined with `stages`)."""

    def as_one(self, build: Callable[["Collectives", List[tf.Tensor]], List[tf.Tensor]],
               inputs: List[tf.Tensor]) -> List[tf.Tensor]:
        """build(collectives, inputs), several collectives that follow each other (the machine
        stages of one tensor) run as one: where a library runs a step's collectives apart from
        it, they go in one loop rather than a chain of loops the step waits on in turn."""
        return build(self, inputs)

    def allreduce_all(self, tensors: List[tf.Tensor], average: bool) -> List[tf.Tensor]:
        """The allreduce of each of `tensors` (a step's gradients), over all workers."""
        return [self.allreduce(tensor, average) for tensor in tensors]

    @abc.abstractmethod
    def allgather_slices(self, slices: tf.IndexedSlices, average: bool) -> tf.IndexedSlices:
        """Every worker's slices, concatenated (their values over the workers' number when
        `average`): a sparse gradient's sum or mean, its rows not added up."""

    @abc.abstractmethod
    def broadcast(self, tensor: tf.Tensor, name: str) -> tf.Tensor:
        """The chief's `tensor` on every worker."""

    @abc.abstractmethod
    def broadcast_variables(self, variables: List[tf.Variable]) -> tf.Operation:
        """An op that assigns the chief's values to `variables` on every worker."""

    # -- the process's membership ---------------------------------------------------------
    @abc.abstractmethod
    def join(self, stages: bool) -> None:
        """Join the other workers (they all call it at the same point), with the groups of the
        machine stages if `stages`; a no-op where joined so already."""

    @abc.abstractmethod
    def leave(self) -> None:
        """Leave (every worker at the same point), so that the library costs nothing while no
        step uses it; `join` again later is allowed."""

    # -- agreements, each a small graph and session of its own, run now --------------------
    def any_worker(self, name: str) -> Callable[[bool], bool]:
        """A function of this worker's flag: whether any worker passed True."""
        graph = tf.Graph()
        with graph.as_default():
            flag = tf.compat.v1.placeholder(tf.int32, [])
            flags = self.allreduce(flag, average=False, name=name)
        session = self.session(graph)
        return lambda mine: bool(session.run(flags, {flag: np.int32(mine)}))

    def chief_vector(self, name: str) -> Callable[[np.ndarray], np.ndarray]:
        """A function of this worker's float64 vector: the chief's, which waits for every
        worker; all of them pass vectors of one length."""
        graph = tf.Graph()
        with graph.as_default():
            vector = tf.compat.v1.placeholder(tf.float64, [None])
            agreed = self.broadcast(vector, name=name)
        session = self.session(graph)
        return lambda values: session.run(agreed, {vector: values})
