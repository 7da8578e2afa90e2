"""When a worker process is in the job's collectives: the one owner of joining and leaving.

A process joins while a runner's steps or agreements need the collectives and leaves them
otherwise: idle, Horovod's background thread still coordinates the workers every cycle, CPU
the steps lose where the cores are shared. Every worker calls each method at the same point of
the script, as the library needs."""
from __future__ import annotations

from parallax.collectives.base import Collectives


class Membership:
    def __init__(self, collectives: Collectives):
        self._collectives = collectives
        self._stages = False  # joined with the machine stages' groups
        # A runner the process returned runs collectives in its steps, or agrees through them
        # (a MonitoredTrainingSession): no later get_runner may leave them.
        self._in_use = False

    def join(self, stages: bool) -> None:
        """Join, with the machine stages' groups if `stages` (a no-op where joined so)."""
        self._stages = stages
        self._collectives.join(stages)

    def rejoin(self) -> None:
        """Join again as last joined (AUTO's trials, after a plan that left)."""
        self._collectives.join(self._stages)

    def keep_for(self, in_use: bool) -> None:
        """A runner the process returns uses the collectives (`in_use`): they stay joined."""
        self._in_use |= in_use

    def leave_if_unused(self) -> bool:
        """Leave unless a runner of the process uses the collectives; whether it left."""
        if self._in_use:
            return False
        self._collectives.leave()
        return True
