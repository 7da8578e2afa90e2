"""TF1 behaviour for a part of a workload, as ported TF1 code runs: the script's first line is
tf.compat.v1.disable_v2_behavior() (reference variables, shapes of Dimension entries, v1
control flow, DatasetV1)."""
import contextlib

import tensorflow as tf
from tensorflow.python.framework import ops


@contextlib.contextmanager
def behaviour(tf1: bool):
    """TF1 behaviour inside when `tf1`; the process's TF2 behaviour after, in graph mode if it
    was: enable_v2_behavior() would also enable eager execution, which TensorFlow refuses once
    the process's default graph has been used."""
    if not tf1:
        yield
        return
    eager = tf.executing_eagerly()
    tf.compat.v1.disable_v2_behavior()
    try:
        yield
    finally:
        enable_eager = ops.enable_eager_execution
        if not eager:
            ops.enable_eager_execution = lambda *args, **kwargs: None
        try:
            tf.compat.v1.enable_v2_behavior()
        finally:
            ops.enable_eager_execution = enable_eager
