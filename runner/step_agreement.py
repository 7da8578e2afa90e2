"""Whether the workers still run the same steps, judged from each one's last beat (a
`Progress`): workers wait for each other in every step, so workers that sit in one for too long
wait for one that is not coming (`stall`); and what one worker did at a point of its steps that
all must do there — a restore from a checkpoint — another passed without doing
(`unmatched_mark`): the two no longer train the same model. Each says why the job must stop,
naming the workers, or None."""
from __future__ import annotations

import collections
from typing import Dict, List, Optional, Tuple

from runner.beat_message import Progress


def stall(progress: Dict[str, Progress], stall_timeout: float) -> Optional[str]:
    """Workers (of the running ones, `progress`) in a run for more than `stall_timeout`,
    and those they wait for."""
    stuck = {name: p for name, p in progress.items()
             if p.in_run_seconds is not None and p.in_run_seconds > stall_timeout}
    if not stuck:
        return None
    # Those not in that step (they have not finished more steps than the stuck ones) are
    # the ones the others wait for.
    step = max(p.steps for p in stuck.values())
    behind = [f"{name} (step {p.steps}, " + ("not in a run)" if p.in_run_seconds is None
                                              else f"in a run for {p.in_run_seconds:.0f} s)")
              for name, p in progress.items() if name not in stuck and p.steps <= step]
    waiting = ", ".join(f"{name} (step {p.steps + 1})" for name, p in stuck.items())
    message = (f"stalled: {waiting} in a step for more than {stall_timeout:g} s "
               "(stall_timeout_secs)")
    message += (f"; behind: {', '.join(behind)}" if behind
                else "; every worker is in it (a server or the network does not answer)")
    return message + (". Workers wait for each other in every step: each must run the "
                      "same sequence of training runs")


def unmatched_mark(progress: Dict[str, Progress]) -> Optional[str]:
    """A mark one worker made after a step that another worker passed without making it.
    Each beat is one worker's state at one moment: what a worker made after fewer steps
    than it has finished is final, so two workers are compared up to the fewer steps.
    Each mark is compared once with the worker that made it most often at that step."""
    counts = {name: {what: collections.Counter(at) for what, at in p.marks.items()}
              for name, p in progress.items()}
    for what, step, first, most in _marks_by_step(counts):
        for second, theirs in progress.items():
            if (step < min(progress[first].steps, theirs.steps)
                    and counts[second].get(what, {}).get(step, 0) < most):
                when = f"after its step {step}" if step else "before its first step"
                return (f"{first} {what} {when} and {second} did not, going on to step "
                        f"{step + 1}: the workers no longer train the same model. Every "
                        "worker must run the same sequence of runs")
    return None


def _marks_by_step(counts: Dict[str, Dict[str, collections.Counter]]
                   ) -> List[Tuple[str, int, str, int]]:
    """(what, step, the worker that made it most often after that step, how often) for
    every mark any worker made, in the order of the steps; `counts`: per worker and mark,
    how often it was made after each step."""
    most: Dict[Tuple[str, int], Tuple[int, str]] = {}
    for name, marks in counts.items():
        for what, made in marks.items():
            for step, count in made.items():
                if count > most.get((what, step), (0, ""))[0]:
                    most[what, step] = (count, name)
    return [(what, step, name, count) for (what, step), (count, name)
            in sorted(most.items(), key=lambda item: (item[0][1], item[0][0]))]
