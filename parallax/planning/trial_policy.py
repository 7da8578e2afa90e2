"""The trials' policy (Config.trial_steps): in which order, for how many steps, the plans AUTO
times take turns on the cluster, which one it keeps, and how far the cost model's predictions
were from their measured steps there. Plain values, no TensorFlow; runtime/trials.py runs it.

The plans take two passes over the job's training steps, the second in the reverse order
(A B C, C B A): in the first each plan warms up (a third of its steps, untimed: a plan's first
steps are slower, its session's first runs and more), then is timed; in the second it is timed
again. So no plan pays for being first, a drift of the machine weighs on all alike, and a
switch, which carries the whole state from one plan to the next (at 100 Mbit, seconds for
`lm`), happens 2(n-1) times; each plan counts the mean of its turns."""
from __future__ import annotations

import dataclasses
import statistics
from typing import List, Optional, Sequence

TIMED_TURNS = 2


@dataclasses.dataclass(frozen=True)
class Turn:
    index: int  # the plan's: 0 the cost model's choice, then the alternatives
    steps: int
    timed: bool


def schedule(plans: int, steps: int) -> List[Turn]:
    """Each plan's warm-up (a third of `steps`, at least one) and first timed turn, in turn,
    then its second timed turn, in the reverse order: the cost model's choice (0) last, so
    that where it wins (on slow links, where moving the state costs most) the training goes
    on with it without another switch."""
    warm = max(1, steps // 3)
    timed = max(1, (steps - warm) // TIMED_TURNS)
    first = [turn for index in range(plans)
             for turn in (Turn(index, warm, False), Turn(index, timed, True))]
    return first + [Turn(index, timed, True) for index in reversed(range(plans))]


def measured(turns: Sequence[float]) -> float:
    """A plan's step: the mean of its turns' median steps (one early, one late in the
    trials, so that a steady drift of the machine weighs on every plan alike)."""
    return statistics.mean(turns)


def keep(steps: Sequence[float]) -> int:
    """The plan kept: the fastest measured."""
    return min(range(len(steps)), key=lambda index: steps[index])


def model_ratio(predicted: Sequence[Optional[float]], steps: Sequence[float]
                ) -> Optional[float]:
    """How the cost model's predictions compare with the steps measured on this cluster: the
    median of measured / predicted over the plans it predicted; a prediction times it is the
    corrected one."""
    ratios = [step / guess for guess, step in zip(predicted, steps) if guess]
    return statistics.median(ratios) if ratios else None
