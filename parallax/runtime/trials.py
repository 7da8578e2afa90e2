"""AUTO's trials (Config.trial_steps): the job trains its first steps with each plan the driver
sent, in turn, and keeps the plan whose steps were fastest on the cluster. Every candidate's
runner is built at the start; a switch carries the job's state from one session to the next —
the variables (the chief's, servers' included, then broadcast to the replicas), each worker's
local variables, and the position of its tf.data iterators — so the trial steps are real
steps of one training, as one device would run them.

Every worker switches after the same training step and takes the chief's timings, so they all
keep the same plan. The order, the turns and the choice are planning/trial_policy.py's."""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import statistics
import tempfile
import time
from typing import Callable, List, Optional

import numpy as np
import tensorflow as tf

from parallax.errors import ParallaxError
from parallax.planning import trial_policy as policy
from parallax.runtime.session import ParallaxRunner
from parallax.vocabulary import load_values

log = logging.getLogger("parallax")


@dataclasses.dataclass
class Quiet:
    """Leaving the job's collectives (Horovod) for the trial of a plan whose steps use none.
    Idle, Horovod's background thread still coordinates the workers every cycle, CPU the steps
    lose on shared cores, and such a plan, once kept, runs without it (worker.py): timed with
    it, it would be timed slower than it runs (benchmarks/HISTORY.md)."""
    idle: List[bool]  # per candidate: its steps use no collective
    leave: Callable[[], bool]  # whether it left (not where another runner uses Horovod)
    join: Callable[[], None]  # the switches and the agreement need the collectives


@dataclasses.dataclass
class Candidate:
    name: str  # how the plan was made: the cost model's choice, or a run option's rule
    predicted: Optional[float]  # seconds of a step, as the cost model predicted
    runner: ParallaxRunner
    measured: Optional[float] = None  # the median of its turns, as the chief saw them
    quiet: bool = False  # timed without the job's collectives (Quiet)
    # per timed turn: the median seconds of its steps
    turns: List[float] = dataclasses.field(default_factory=list)


class TrialRunner(ParallaxRunner):
    """The runner a worker returns under AUTO with trials: the runner of the plan in use, until
    each plan had `steps` training steps; then that of the fastest. Everything else a runner
    does is its current plan's runner's."""

    # The runner of the plan in use holds the session: nothing of ParallaxRunner's to set up.
    def __init__(self, candidates: List[Candidate], steps: int,  # pylint: disable=W0231
                 agree: Callable[[np.ndarray], np.ndarray],
                 on_kept: Callable[["TrialRunner", Candidate], None], build_seconds: float,
                 quiet: Optional[Quiet] = None):
        self._candidates = candidates
        self._trial_steps = steps
        self._agree = agree  # the chief's vector, on every worker (a collective: a barrier)
        self._on_kept = on_kept
        self._turns = policy.schedule(len(candidates), steps)
        self._turn = 0
        self._index = 0
        self._times: List[float] = []
        self._kept: Optional[Candidate] = None
        # What the trials cost beyond their steps: the other plans' runners, then the switches
        self.overhead = {"build": build_seconds, "switch": 0.0}
        self._quiet = quiet
        self._left = False  # the collectives, for the trial in progress
        self._leave_if_idle()

    def __getattr__(self, name):
        # Only reached for what this object does not hold: the current plan's runner's.
        return getattr(self._candidates[self._index].runner, name)

    @property
    def settled(self) -> bool:
        return self._kept is not None

    @property
    def candidates(self) -> List[Candidate]:
        return self._candidates

    @property
    def current(self) -> ParallaxRunner:
        return self._candidates[self._index].runner

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None, report=None):
        result = self.current.run(fetches, feed_dict, options, run_metadata, report)
        training, seconds = self.current.last_run
        if self._kept is None and training:
            self._times.append(seconds)
            if len(self._times) == self._turns[self._turn].steps:
                self._next()
        return result

    def describe(self) -> str:
        lines = [self.current.describe(), "trials on the cluster (Config.trial_steps="
                 f"{self._trial_steps}: a third untimed, then {policy.TIMED_TURNS} timed turns, "
                 "the second pass in the reverse order, the mean of the turns' median "
                 "steps; building the other "
                 f"plans took {self.overhead['build']:.1f} s, switching "
                 f"{self.overhead['switch']:.1f} s):"]
        ratio = self._model_ratio()
        for index, candidate in enumerate(self._candidates):
            predicted = "-" if candidate.predicted is None else (
                f"{candidate.predicted * 1e3:.1f}" + (
                    f" (corrected {candidate.predicted * ratio * 1e3:.1f})" if ratio else ""))
            measured = "-" if candidate.measured is None else f"{candidate.measured * 1e3:.1f}"
            state = ("kept" if candidate is self._kept else
                     "in use" if self._kept is None and index == self._index else "")
            quiet = " without Horovod" if candidate.quiet else ""
            lines.append(f"  {candidate.name}: predicted {predicted} ms, measured {measured} "
                         f"ms{_turns(candidate)}{quiet} {state}".rstrip())
        if ratio:
            lines.append(f"  the cost model on this cluster: measured / predicted {ratio:.2f} "
                         "(the median over the plans; the corrected predictions are times it)")
        return "\n".join(lines)

    def _model_ratio(self) -> Optional[float]:
        if self._kept is None:
            return None
        return policy.model_ratio([c.predicted for c in self._candidates],
                                  [c.measured for c in self._candidates])

    def close(self) -> None:
        """Close the plan in use as a runner closes (its last checkpoint); the others, whose
        state is behind, without saving (those AUTO did not keep are closed already)."""
        if self._kept is not None:
            self._kept.runner.close()
            return
        for index, candidate in enumerate(self._candidates):  # the script ended in the trials
            if index == self._index:
                candidate.runner.close()
            else:
                candidate.runner.close_after_trial()

    def _next(self) -> None:
        """After a turn's steps: on to the next turn's plan, or, after the last, to the
        fastest plan."""
        turn = self._turns[self._turn]
        if turn.timed:
            self._candidates[turn.index].turns.append(statistics.median(self._times))
        self._times = []
        self._turn += 1
        if self._turn < len(self._turns):
            following = self._turns[self._turn].index
            if following != self._index:  # the collectives for the switch, then left again
                self._join_if_left()
                self._switch(following)
                self._leave_if_idle()
            return
        self._join_if_left()
        agreed = self._agree(np.array([policy.measured(c.turns) for c in self._candidates],
                                      np.float64))
        for candidate, seconds in zip(self._candidates, agreed):
            candidate.measured = float(seconds)
        fastest = policy.keep([c.measured for c in self._candidates])
        if fastest != self._index:
            self._switch(fastest)
        self._kept = self._candidates[fastest]
        for candidate in self._candidates:
            if candidate is not self._kept:
                candidate.runner.close_after_trial()
        self._on_kept(self, self._kept)

    def _leave_if_idle(self) -> None:
        if self._quiet is not None and self._quiet.idle[self._index]:
            started = time.perf_counter()
            if self._quiet.leave():
                self._left = self._candidates[self._index].quiet = True
            self.overhead["switch"] += time.perf_counter() - started

    def _join_if_left(self) -> None:
        if self._left:
            started = time.perf_counter()
            self._quiet.join()
            self._left = False
            self.overhead["switch"] += time.perf_counter() - started

    def _switch(self, index: int) -> None:
        started = time.perf_counter()
        carry(self.current, self._candidates[index].runner, self._agree)
        self._index = index
        self.overhead["switch"] += time.perf_counter() - started


def carry(old: ParallaxRunner, new: ParallaxRunner,
          barrier: Callable[[np.ndarray], np.ndarray]) -> None:
    """The job's state from `old`'s session into `new`'s, on every worker at once: the chief
    writes every variable of the model (those on servers too), then every replica takes the
    chief's, each worker its own local variables and iterators' positions."""
    shared = _common(old, new, tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    if old.is_chief:
        load_values(new.session, shared[1], old.session.run(shared[0]))
    own = _common(old, new, tf.compat.v1.GraphKeys.LOCAL_VARIABLES)
    load_values(new.session, own[1], old.session.run(own[0]))
    folder = tempfile.mkdtemp(prefix="parallax-trial-")
    try:
        _carry_iterators(old, new, os.path.join(folder, "iterators"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    barrier(np.zeros(0))  # the chief has written the servers' variables and its replicas
    new.session.run(new.broadcast_ops)
    new.count_steps()


def _common(old: ParallaxRunner, new: ParallaxRunner, key: str):
    """The variables of `key` both graphs have, by name: old's, new's."""
    by_name = {v.op.name: v for v in new.transformed_graph.get_collection(key)}
    pairs = [(v, by_name[v.op.name]) for v in old.transformed_graph.get_collection(key)
             if v.op.name in by_name]
    return [o for o, _ in pairs], [n for _, n in pairs]


def _carry_iterators(old: ParallaxRunner, new: ParallaxRunner, prefix: str) -> None:
    """Each tf.data iterator of `old` goes on in `new` where it stopped (through a file of this
    worker's own, as a checkpoint's input position)."""
    why = old.input_iterators.save(old.session, prefix)
    if why is not None:
        raise ParallaxError(f"AUTO's trials: the position of {why}; it cannot be carried "
                            "to the next plan: use Config(trial_steps=0)")
    new.input_iterators.restore(new.session, prefix)


def describe_kept(runner: TrialRunner, kept: Candidate) -> str:
    return ("AUTO timed its plans on the cluster: " + "; ".join(
        f"{c.name} {c.measured * 1e3:.1f} ms a step{_turns(c)}"
        + (f" (predicted {c.predicted * 1e3:.1f})" if c.predicted is not None else "")
        + (" without Horovod" if c.quiet else "")
        for c in runner.candidates) + f"; kept {kept.name} (the trials cost "
        f"{runner.overhead['build']:.1f} s building the other plans and "
        f"{runner.overhead['switch']:.1f} s switching, besides their steps)")


def _turns(candidate: Candidate) -> str:
    if len(candidate.turns) < 2:
        return ""
    return " (turns " + ", ".join(f"{seconds * 1e3:.1f}" for seconds in candidate.turns) + ")"
