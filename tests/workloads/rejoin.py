"""A worker of 2 machines x 2 that joins Horovod ROUNDS times in one process, with the machine
stages' process sets every other time, and leaves it after an allreduce in every set it is in;
prints one line per round. Started by tests/test_machine_allreduce.py with a GlooRendezvous."""
import os
import sys

import horovod.tensorflow as hvd
import tensorflow as tf

from parallax.cluster import Cluster
from parallax.rewriting import machine_allreduce

rank = int(os.environ["HOROVOD_RANK"])
cluster = Cluster(worker_machines=[0, 0, 1, 1], worker_id=rank)
for round_ in range(int(sys.argv[1])):
    stages = round_ % 2 == 1
    machine_allreduce.init_horovod(cluster, stages)
    sums = [hvd.allreduce(tf.constant(float(rank + 1)), op=hvd.Sum)]
    if stages:  # each machine's workers, then each position's across machines
        sums += [hvd.allreduce(tf.constant(float(rank + 1)), op=hvd.Sum,
                               process_set=machine_allreduce._process_set(  # noqa: SLF001
                                   cluster.machine_groups(), index))
                 for index, group in enumerate(cluster.machine_groups()) if rank in group]
    print(f"round {round_}: {[float(s) for s in sums]}", flush=True)
    machine_allreduce.leave_horovod()
