"""The trials' policy (Config.trial_steps): in which order, for how many steps, the plans AUTO
times take turns on the cluster, which one it keeps, and how far the cost model's predictions
were from their measured steps there. Plain values, no TensorFlow; runtime/trials.py runs it.

Each plan first trains a third of its steps untimed, in turn (a plan's first steps are slower:
its session's first runs and more); then the plans take TIMED_TURNS turns of timed steps in
alternation, A B C A B C A B C, so that none pays for being first and a drift of the machine
weighs on all alike; each counts the median of its turns."""
from __future__ import annotations

import dataclasses
import statistics
from typing import List, Optional, Sequence, TypeVar

TIMED_TURNS = 3
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Turn:
    index: int  # the plan's, in the trials' order
    steps: int
    timed: bool


def order(plans: Sequence[T]) -> List[T]:
    """The trials' order of [the cost model's choice, alternatives...]: the alternatives first
    and the choice last, so that where it wins (on slow links, where moving the state costs
    most) the training goes on with it without another switch."""
    return list(plans[1:]) + list(plans[:1])


def schedule(plans: int, steps: int) -> List[Turn]:
    """Each plan's warm-up (a third of `steps`, at least one), in turn, then TIMED_TURNS
    rounds of the rest in alternation."""
    warm = max(1, steps // 3)
    timed = max(1, (steps - warm) // TIMED_TURNS)
    return ([Turn(index, warm, False) for index in range(plans)]
            + [Turn(index, timed, True) for _ in range(TIMED_TURNS) for index in range(plans)])


def measured(turns: Sequence[float]) -> float:
    """A plan's step: the median of its turns' median steps (one disturbed turn does not
    decide)."""
    return statistics.median(turns)


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
