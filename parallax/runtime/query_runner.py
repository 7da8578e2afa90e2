"""get_runner's runner under `python -m parallax.plan` for a graph the script feeds through
feed_dict, whose input the driver cannot read before the script runs: a session of the graph on
this machine alone, standing for worker 0 of the queried cluster. The script trains with it as
it would with a Parallax runner, and the feeds of its first training steps (runs that fetch a
training update; an evaluation's runs are not steps), one per worker of the cluster's step,
are what the measurement reads (measure.measure_in); then the answer is written and the script
ends."""
from __future__ import annotations

import contextlib
from typing import Callable, List, NoReturn, Optional

import numpy as np

import tensorflow as tf

from parallax.planning.analysis import GraphAnalysis
from parallax.planning.measure import Measurements, measure_in, probe_session
from parallax.planning.query import FedSteps
from parallax.vocabulary import downstream_ops


class QueryRunner:
    """The runner's face a training loop uses: run, is_chief, worker_id, num_workers,
    as_default, close."""
    is_chief = True
    worker_id = 0

    def __init__(self, graph: tf.Graph, analysis: GraphAnalysis, measured: Measurements,
                 answer: Callable[[Measurements, Optional[int], FedSteps], None]):
        self._analysis, self._measured, self._answer = analysis, measured, answer
        writes = [graph.get_operation_by_name(name) for name in analysis.training_writes]
        self._training = {*writes, *downstream_ops(writes)}  # what fetched makes a step
        self._feeds: List[dict] = []
        self._other_runs = 0
        self._closing = contextlib.ExitStack()
        self.session = self._closing.enter_context(probe_session(graph))

    @property
    def num_workers(self) -> int:
        return self._measured.shape.workers

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        result = self.session.run(fetches, feed_dict, options, run_metadata)
        if not self._trains(fetches):
            self._other_runs += 1
        elif feed_dict:
            self._feeds.append(dict(feed_dict))
            if len(self._feeds) == self.num_workers:
                self._finish()
        return result

    def as_default(self):
        return self.session.as_default()

    def close(self) -> None:
        """A script that trained fewer steps than the cluster has workers: its feeds, reused
        in turn, stand for the others'."""
        if self._feeds:
            self._finish()
        self._closing.close()

    def _trains(self, fetches) -> bool:
        graph = self.session.graph
        for fetch in tf.nest.flatten(fetches, expand_composites=True):
            element = graph.as_graph_element(fetch)
            if (element if isinstance(element, tf.Operation) else element.op) in self._training:
                return True
        return False

    def _finish(self) -> NoReturn:
        measured = self._measured
        measured.problem = None
        measure_in(self.session, self._analysis, measured, self._feeds)
        self._closing.close()
        first = next(iter(self._feeds[0].values()))  # the batch: a fed tensor's first dimension
        self._answer(measured, len(first) if np.ndim(first) else None,
                     FedSteps(len(self._feeds), self._other_runs, self.num_workers))
        raise SystemExit(0)  # the script's work is done: its answer
