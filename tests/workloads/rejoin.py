"""A worker of 2 machines x 2 that joins Horovod ROUNDS times in one process, with the machine
stages' process sets every other time, and leaves it after an allreduce in every set it is in;
prints one line per round. Started by tests/test_machine_allreduce.py with a GlooRendezvous."""
import os
import sys

import tensorflow as tf

from parallax.cluster import Cluster
from parallax.collectives.horovod import HorovodCollectives

rank = int(os.environ["HOROVOD_RANK"])
collectives = HorovodCollectives(Cluster(worker_machines=[0, 0, 1, 1], worker_id=rank))
for round_ in range(int(sys.argv[1])):
    stages = round_ % 2 == 1
    collectives.join(stages)
    mine = tf.constant(float(rank + 1))
    sums = [collectives.allreduce(mine, average=False)]
    if stages:  # each machine's workers, then each position's across machines
        sums += [collectives.allreduce(mine, average=False, group=group)
                 for group in collectives.cluster.machine_groups() if rank in group]
    print(f"round {round_}: {[float(s) for s in sums]}", flush=True)
    collectives.leave()
