"""What the input's position adds to a checkpoint (docs/checkpoints.md): the bytes of one
worker's saved tf.data state and the time of its save, for a few input pipelines.

    python benchmarks/input_position.py [--out FILE]

Each pipeline is drawn from a few times, then its state is saved 20 times (as a checkpoint
does, runtime/input_position.Iterators); the median save and the files' bytes are reported.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from parallax.runtime.input_position import Iterators  # noqa: E402

import report  # noqa: E402

SAVES = 20


def pipelines():
    """name: (a dataset maker, what it holds)."""
    def ids():  # tests/workloads/resumable.py's: shuffled ids, batched, prefetched
        return (tf.data.Dataset.range(200).shuffle(50, seed=3).repeat()
                .map(lambda i: (i % 40, tf.sin(tf.cast(i, tf.float32)))).batch(3).prefetch(2))

    def images(buffer):
        def image(i):  # noise: TensorFlow compresses the state, and would a constant
            return tf.cast(tf.random.stateless_uniform([32, 32, 3], [i, 0], maxval=256,
                                                       dtype=tf.int64), tf.uint8)
        return lambda: (tf.data.Dataset.range(100000).map(image).shuffle(buffer, seed=1)
                        .batch(32).prefetch(2))
    return {"ids, shuffle 50, batch 3": ids,
            "32x32x3 random images, shuffle 1000, batch 32": images(1000),
            "32x32x3 random images, shuffle 10000, batch 32": images(10000)}


def measure(make) -> tuple:
    graph = tf.Graph()
    with graph.as_default():
        draw = tf.compat.v1.data.make_one_shot_iterator(make()).get_next()
        iterators = Iterators(graph)
    with tf.compat.v1.Session(graph=graph) as session, tempfile.TemporaryDirectory() as folder:
        for _ in range(5):
            session.run(draw)
        seconds = []
        for index in range(SAVES):
            prefix = os.path.join(folder, f"position-{index}")
            started = time.perf_counter()
            why = iterators.save(session, prefix)
            seconds.append(time.perf_counter() - started)
            assert why is None, why
        size = sum(os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder)
                   if name.startswith("position-0."))
    return size, statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="also write the table here (markdown)")
    args = parser.parse_args()
    tf.compat.v1.disable_eager_execution()
    lines = ["| input of one worker | bytes saved | ms a save (median of 20) |",
             "|---|---|---|"]
    for name, make in pipelines().items():
        size, seconds = measure(make)
        lines.append(f"| {name} | {size:,} | {seconds * 1e3:.1f} |")
    report.print_and_save(lines, args.out)


if __name__ == "__main__":
    main()
