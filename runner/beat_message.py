"""What a beat says, and the schema the driver checks it against before using any of it: a beat
is the JSON of {job, name, sequence, exiting, progress}, `progress` a process's `Progress`.
Whatever comes from the network and is not of the schema is `Refused`, never a crash (a beat
with "in_run_seconds": "x" once stopped the driver with a TypeError)."""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Collection, Dict, List, Optional

MAX_DIGESTS = 64
_BEAT_FIELDS = {"job", "name", "sequence", "exiting", "progress"}


class Refused(ValueError):
    """A beat the driver does not act on, and why."""


def refuse_unless(condition: bool, why: str) -> None:
    if not condition:
        raise Refused(why)


@dataclasses.dataclass
class Progress:
    """What a process says of itself with each beat. Workers count their training steps; a
    server says nothing but that it is alive."""

    steps: int = 0  # training steps this process has finished
    step_seconds: float = 0.0  # their total time since the last beat
    new_steps: int = 0  # how many of them since the last beat
    scalars: Dict[str, List[float]] = dataclasses.field(default_factory=dict)  # name: [sum, n]
    in_run_seconds: Optional[float] = None  # how long the run under way has lasted
    # What the process did that every worker must do at the same point: what -> after how many
    # of its steps, each time it did it (since the process started, like `steps`).
    marks: Dict[str, List[int]] = dataclasses.field(default_factory=dict)
    # Digests of values the process saw, by name, sent once (ControlServer.identical_digests).
    digests: Dict[str, str] = dataclasses.field(default_factory=dict)

    def add(self, other: "Progress") -> None:
        """Count `other`'s new steps, their time and its scalars in this one too (and take
        its digests, when this one has none)."""
        self.digests = self.digests or other.digests
        self.new_steps += other.new_steps
        self.step_seconds += other.step_seconds
        for name, (value, count) in other.scalars.items():
            total = self.scalars.setdefault(name, [0.0, 0])
            total[0] += value
            total[1] += count

    @classmethod
    def from_message(cls, message) -> "Progress":
        """The progress of a beat, its every field checked for its type (Refused if not)."""
        refuse_unless(isinstance(message, dict) and set(message) <= _PROGRESS_FIELDS,
                      "progress is not an object of Progress's fields")
        progress = cls(**message)
        refuse_unless(_count(progress.steps) and _count(progress.new_steps),
                      "steps: not counts")
        refuse_unless(_seconds(progress.step_seconds), "step_seconds: not seconds")
        refuse_unless(progress.in_run_seconds is None or _seconds(progress.in_run_seconds),
                      "in_run_seconds: not seconds")
        refuse_unless(isinstance(progress.scalars, dict) and all(
            isinstance(value, list) and len(value) == 2 and _float(value[0])
            and _count(value[1]) for value in progress.scalars.values()),
            "scalars: not name: [sum, count]")
        refuse_unless(isinstance(progress.marks, dict) and all(
            isinstance(at, list) and all(_count(step) for step in at)
            for at in progress.marks.values()), "marks: not name: [steps]")
        refuse_unless(
            isinstance(progress.digests, dict) and len(progress.digests) <= MAX_DIGESTS
            and all(isinstance(name, str) and len(name) <= 200 and isinstance(digest, str)
                    and len(digest) <= 64 for name, digest in progress.digests.items()),
            "digests: not name: digest")
        progress.step_seconds = float(progress.step_seconds)
        progress.scalars = {name: [float(value), count]
                            for name, (value, count) in progress.scalars.items()}
        return progress


_PROGRESS_FIELDS = {field.name for field in dataclasses.fields(Progress)}


def parse_beat(body: bytes, job: str, names: Collection[str]) -> dict:
    """The beat in `body` (authenticated already), of the schema, of job `job` and from one of
    its processes `names`, its progress a `Progress`; else Refused."""
    try:
        beat = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested too deep
        raise Refused("not JSON") from None
    refuse_unless(isinstance(beat, dict) and set(beat) <= _BEAT_FIELDS, "not a beat")
    refuse_unless(beat.get("job") == job, "of another job")
    refuse_unless(isinstance(beat.get("name"), str) and beat["name"] in names,
                  "from a process not of this job")
    refuse_unless(_count(beat.get("sequence")), "sequence: not a count")
    refuse_unless(isinstance(beat.get("exiting", False), bool), "exiting: not true or false")
    if beat.get("progress") is not None:
        beat["progress"] = Progress.from_message(beat["progress"])
    return beat


def _count(value) -> bool:
    return type(value) is int and value >= 0  # pylint: disable=unidiomatic-typecheck  (not bool)


def _float(value) -> bool:  # a reported loss may be NaN
    return type(value) in (int, float)  # pylint: disable=unidiomatic-typecheck  (not bool)


def _number(value) -> bool:
    return _float(value) and math.isfinite(value)


def _seconds(value) -> bool:
    return _number(value) and value >= 0
