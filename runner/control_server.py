"""The job's control plane, the driver's side: `ControlServer`, which every process the driver
starts calls every few seconds with its progress (runner/heartbeat.py).

The driver learns that a process is alive (a SIGSTOPped or cut-off process stops beating: the
job is stopped, naming it), how far each worker is and what each did that all must do at the
same point of their steps (runner/step_agreement.py says when they no longer agree), what the
user asked to report (a loss), for its progress bar and metrics file, and digests of values
each worker saw that the driver compares across workers (its first step's input: all equal is
a dataset nobody sharded).

It acts on a beat only when it is signed with the job's key (runner/beat_signing.py), numbered
above the last beat of its process, and of the schema (runner/beat_message.py); it refuses,
logs and otherwise ignores any other. It listens on the driver's address towards the hosts only
(runner/control_transport.py).
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import math
import sys
import threading
import time
from typing import Callable, Dict, List, Optional

from runner import control_transport, step_agreement
from runner.beat_message import Progress, Refused, parse_beat, refuse_unless
from runner.beat_signing import ANSWER, BEAT, UNSIGNED, new_key, signed, verified
from runner.heartbeat import Heartbeat

REFUSALS_LOGGED_EVERY_SECONDS = 10.0
PAUSE_SECONDS = 1.0  # between two checks of ControlServer.check: the driver was not running


@dataclasses.dataclass
class _Status:
    started: float
    last_beat: Optional[float] = None
    exiting_since: Optional[float] = None  # it said it is exiting (its atexit handlers run)
    progress: Progress = dataclasses.field(default_factory=Progress)  # the latest
    since_taken: Progress = dataclasses.field(default_factory=Progress)  # summed since then
    sequence: int = 0  # of its last beat: a beat numbered no higher is a replay
    digests: Dict[str, str] = dataclasses.field(default_factory=dict)  # as first reported

    def shift(self, seconds: float, now: float) -> None:
        """Its times `seconds` later (no later than now): the driver was not running then."""
        self.started = min(self.started + seconds, now)
        if self.last_beat is not None:
            self.last_beat = min(self.last_beat + seconds, now)
        if self.exiting_since is not None:
            self.exiting_since = min(self.exiting_since + seconds, now)


class ControlServer:
    """The driver's side. `names` are the job's processes; `workers` those that run steps. It
    listens on `address`, the driver's address its processes reach it at; refusals go to
    `log`, a line each, the same reason at most every REFUSALS_LOGGED_EVERY_SECONDS."""

    def __init__(self, job: str, names: List[str], workers: List[str], heartbeat_timeout: float,
                 stall_timeout: float, address: str = "127.0.0.1",
                 log: Optional[Callable[[str], None]] = None):
        self.job = job
        self.key = new_key()
        self.address = address
        self._host = f"[{address}]" if ":" in address else address  # as host:port takes it
        self.heartbeat_timeout = heartbeat_timeout
        self.stall_timeout = stall_timeout
        self.workers = list(workers)
        self.refused: collections.Counter = collections.Counter()  # why: how many
        self._log = log or (lambda line: print(f"parallax: {line}", file=sys.stderr, flush=True))
        self._logged: Dict[str, float] = {}  # why: when last logged
        self._lock = threading.Lock()
        now = time.monotonic()
        self._last_check = now
        self._status = {name: _Status(started=now) for name in names}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="parallax-control",
                                        daemon=True)
        self._thread.start()
        self._server, self.port = asyncio.run_coroutine_threadsafe(
            control_transport.serve(self._host, self.receive), self._loop).result()

    def env_for(self, name: str) -> Dict[str, str]:
        """What process `name` needs to reach this server and prove that it is of the job."""
        return Heartbeat.env_for(f"{self._host}:{self.port}", self.job, name,
                                 self.heartbeat_timeout, self.key)

    def receive(self, request: bytes, peer: str = "this process") -> bytes:
        """Acts on a beat's bytes as they came from `peer`: the answer's bytes."""
        try:
            beat = self._checked(request)
        except Refused as refusal:
            self._refuse(peer, str(refusal))
            return UNSIGNED + json.dumps({"ok": False, "reason": str(refusal)}).encode()
        with self._lock:
            status = self._status[beat["name"]]
            status.sequence = beat["sequence"]
            status.last_beat = time.monotonic()
            if beat.get("exiting"):
                status.exiting_since = status.last_beat
            if beat.get("progress") is not None:
                progress = status.progress = beat["progress"]
                if progress.digests and not status.digests:
                    status.digests = progress.digests
                status.since_taken.steps = progress.steps
                status.since_taken.add(progress)
        return signed(self.key, ANSWER, {"ok": True, "sequence": beat["sequence"]})

    def _checked(self, request: bytes) -> dict:
        """The beat in `request`, authenticated, of the schema and new; else Refused."""
        body = verified(self.key, BEAT, request)
        refuse_unless(body is not None, "not signed with the job's key")
        beat = parse_beat(body, self.job, self._status)
        with self._lock:
            refuse_unless(beat["sequence"] > self._status[beat["name"]].sequence,
                          f"a replay of a beat of {beat['name']}")  # a bounded set of reasons
        return beat

    def _refuse(self, peer: str, why: str) -> None:
        self.refused[why] += 1
        now = time.monotonic()
        if now - self._logged.get(why, -math.inf) >= REFUSALS_LOGGED_EVERY_SECONDS:
            self._logged[why] = now
            self._log(f"control plane: refused a beat from {peer}: {why} "
                      f"({self.refused[why]} so far)")

    def take_progress(self) -> Dict[str, Progress]:
        """Each worker's progress since the last call: its steps so far, and the time of its
        new steps and the reported scalars summed."""
        with self._lock:
            taken = {name: self._status[name].since_taken for name in self.workers}
            for name, progress in taken.items():
                self._status[name].since_taken = Progress(steps=progress.steps)
        return taken

    def reported_digests(self) -> Optional[List[Dict[str, str]]]:
        """Each worker's digests as it first reported them (they change no more), once every
        worker has reported and there are several workers; else None."""
        with self._lock:
            reported = [dict(self._status[name].digests) for name in self.workers]
        return reported if len(reported) > 1 and all(reported) else None

    def identical_digests(self) -> Optional[List[str]]:
        """The names of the digests every worker reported, when there are several workers,
        all have reported the same names, and each name's digest is the same on all; else
        None."""
        with self._lock:
            reported = [self._status[name].digests for name in self.workers]
        if len(reported) < 2 or not reported[0] or any(d != reported[0] for d in reported):
            return None
        return sorted(reported[0])

    def check(self, exited=frozenset()) -> Optional[str]:
        """Why the job must be stopped now, or None: a process that stopped beating (of those
        not `exited`), or workers that no longer agree on their steps (runner/step_agreement.py;
        on the last beats too, which workers send as they exit)."""
        now = time.monotonic()
        slow_limit = 2 * self.heartbeat_timeout + 30  # starting and exiting take longer
        with self._lock:
            # A longer gap between two checks (made every poll) is this driver not running
            # (stopped, starved): the processes' silence in it is not theirs. A gap too long
            # for them to survive is runner.process's to report (pause_limit).
            if now - self._last_check > PAUSE_SECONDS:
                for status in self._status.values():
                    status.shift(now - self._last_check, now)
            self._last_check = now
            for name, status in self._status.items():
                if name in exited:
                    continue
                if status.exiting_since is not None:
                    if now - status.exiting_since > slow_limit:
                        return (f"{name} finished but has not exited in "
                                f"{now - status.exiting_since:.0f} s")
                elif status.last_beat is None:
                    if now - status.started > slow_limit:
                        return (f"{name} never reached the driver's control plane in "
                                f"{now - status.started:.0f} s (stopped, hung at start, or "
                                "cannot reach this machine)")
                elif now - status.last_beat > self.heartbeat_timeout:
                    return (f"{name} sent no heartbeat for {now - status.last_beat:.0f} s "
                            f"(heartbeat_timeout_secs={self.heartbeat_timeout:g}): it is "
                            "stopped, hung, or cut off from this machine")
            running = {name: self._status[name].progress for name in self.workers
                       if name not in exited and self._status[name].exiting_since is None}
            return (step_agreement.stall(running, self.stall_timeout)
                    or step_agreement.unmatched_mark(
                        {name: self._status[name].progress for name in self.workers}))

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._server.stop(None), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
