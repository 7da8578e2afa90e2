"""TF1 behaviour for a part of a workload, as ported TF1 code runs: the script's first line is
tf.compat.v1.disable_v2_behavior() (reference variables, shapes of Dimension entries, v1
control flow, DatasetV1)."""
import contextlib

import tensorflow as tf


@contextlib.contextmanager
def behaviour(tf1: bool):
    """TF1 behaviour inside when `tf1`; the process's TF2 behaviour (eager as it was) after."""
    if not tf1:
        yield
        return
    eager = tf.executing_eagerly()
    tf.compat.v1.disable_v2_behavior()
    try:
        yield
    finally:
        tf.compat.v1.enable_v2_behavior()
        if not eager:
            tf.compat.v1.disable_eager_execution()
