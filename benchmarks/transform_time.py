"""How long Parallax takes to turn a ResNet-50-sized single-device graph into a distributed one:
Keras 3 ResNet50 in a tf.compat.v1 graph with a Momentum optimizer; analysis and plan, then the
AR passes and the PS passes (the chief's graph of 2 machines x 2 workers), their collective ops
the stack's default library's. Prints JSON.

    python benchmarks/transform_time.py
"""
import json
import time

import parallax  # before the graph: gradients are recorded
import keras
import tensorflow as tf

from parallax.planning.analysis import analyze
from parallax.cluster import Cluster
from parallax.rewriting.pipeline import transform
from parallax.planning.job_plan import make_plan

CLUSTER = Cluster(worker_machines=[0, 0, 1, 1], servers=["10.0.0.1:2222", "10.0.0.2:2222"],
                  workers=["10.0.0.1:2223", "10.0.0.1:2224", "10.0.0.2:2223", "10.0.0.2:2224"])


def resnet50_graph() -> tf.Graph:
    graph = tf.Graph()
    with graph.as_default():
        images = tf.compat.v1.placeholder(tf.float32, [32, 224, 224, 3])
        labels = tf.compat.v1.placeholder(tf.int64, [32])
        logits = keras.applications.ResNet50(weights=None)(images)
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits))
        tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(
            loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return graph


def main():
    tf.compat.v1.disable_eager_execution()
    seconds = {}
    for run_option in ("AR", "PS"):
        graph = resnet50_graph()
        ops = len(graph.get_operations())  # the single-device graph's, before the passes
        start = time.perf_counter()
        analysis = analyze(graph)
        plan = make_plan(analysis, parallax.Config(run_option=run_option).plan_options, CLUSTER)
        planned = time.perf_counter()
        transform(graph, plan)
        done = time.perf_counter()
        seconds[f"analysis+plan ({run_option})"] = planned - start
        seconds[f"{run_option} passes"] = done - planned
    print(json.dumps({"model": "Keras 3 ResNet50 + Momentum", "collectives": CLUSTER.collectives,
                      "ops": ops,
                      "variables": len(analysis.variables), "seconds": seconds}))


if __name__ == "__main__":
    main()
