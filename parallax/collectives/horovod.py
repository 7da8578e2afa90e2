"""Collectives by Horovod (gloo on CPU): its allreduce, allgather and broadcast ops, its
process sets for the machine stages, and hvd.init / hvd.shutdown to join and leave. The job's
rendezvous is runner/rendezvous.py's (Horovod's own RendezvousServer)."""
from __future__ import annotations

import os
from typing import List

import horovod.tensorflow as hvd
import tensorflow as tf
from horovod.tensorflow.mpi_ops import _allreduce as allreduce_in_set

from parallax.cluster import Cluster
from parallax.collectives.base import Collectives
from parallax.errors import ParallaxError
from runner import rendezvous

CYCLE_TIME_MS = 5


class HorovodCollectives(Collectives):

    def __init__(self, cluster: Cluster):
        super().__init__(cluster)
        self._groups = [list(group) for group in cluster.machine_groups()]
        self._joined_with_stages = False

    def allreduce(self, tensor, average, group=None, name=None):
        op = hvd.Average if average else hvd.Sum
        if group is None:
            return hvd.allreduce(tensor, op=op, name=name)
        # hvd.init numbers the sets it is given from 1 in order (`join` checks it); the number
        # is not asked of a started Horovod, so that a graph is rewritten where none runs.
        process_set = hvd.ProcessSet(list(group))
        process_set.process_set_id = self._groups.index(list(group)) + 1
        summed = allreduce_in_set(tensor, op=hvd.Sum, process_set=process_set, name=name)
        return summed / len(group) if average else summed

    def allgather_slices(self, slices, average):
        return hvd.allreduce(slices, op=hvd.Average if average else hvd.Sum)

    def broadcast(self, tensor, name):
        return hvd.broadcast(tensor, root_rank=0, name=name)

    def broadcast_variables(self, variables: List[tf.Variable]) -> tf.Operation:
        return hvd.broadcast_variables(variables, 0)

    def join(self, stages: bool) -> None:
        if hvd.is_initialized() and (self._joined_with_stages or not stages):
            return
        self.leave()
        if self._groups:
            # Every Horovod cycle coordinates each process set a worker is in, tensors pending
            # or not: more sets at the default 1 ms cycle cost the steps CPU (unless the user
            # set the cycle).
            os.environ.setdefault("HOROVOD_CYCLE_TIME", str(CYCLE_TIME_MS))
        # The sets only when used: idle, each costs the background thread CPU every cycle.
        sets = [hvd.ProcessSet(group) for group in self._groups] if stages else []
        hvd.init(process_sets=sets)
        self._joined_with_stages = stages
        if hvd.size() != self.cluster.num_workers:
            raise ParallaxError(f"Horovod started with {hvd.size()} of the job's "
                                f"{self.cluster.num_workers} workers: this process was not "
                                "started by Parallax's launcher with the job's rendezvous")
        if [s.process_set_id for s in sets] != list(range(1, len(sets) + 1)):
            raise ParallaxError(f"Horovod numbered the process sets of the machine stages "
                                f"{[s.process_set_id for s in sets]}, not 1 to {len(sets)} in "
                                "order: was hvd.init called before parallax.get_runner?")

    def leave(self) -> None:
        """hvd.shutdown, once every worker is past this round's rendezvous (whose keys can then
        go) and before any joins again: one worker's shutdown stops every worker's Horovod."""
        if not hvd.is_initialized():
            return
        graph = tf.Graph()
        with graph.as_default():
            barrier = hvd.allreduce(tf.constant(0.0), op=hvd.Sum,
                                    name="parallax_leaving_horovod")
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(barrier)
            if hvd.rank() == 0:
                rendezvous.next_round()
            session.run(barrier)
        hvd.shutdown()
        self._joined_with_stages = False
