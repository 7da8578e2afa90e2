"""The job's control plane, on gRPC: the driver serves `ControlServer`; every process it starts
runs a `Heartbeat` thread that calls it every few seconds with the process's progress.

The driver learns that a process is alive (a SIGSTOPped or cut-off process stops beating: the
job is stopped, naming it), how far each worker is (a job whose workers sit in a step that does
not end is a deadlock: the job is stopped, naming the workers that are behind), what each worker
did that all must do at the same point of their steps (a restore from a checkpoint: a worker
that trains on without it no longer trains the same model, and the job is stopped, naming both),
and what the user asked to report (a loss), for its progress bar and metrics file. A process
whose driver stops answering (killed, or on the other side of a partition) stops itself within
the heartbeat timeout, so nothing outlives its job on any host.

Messages are JSON over gRPC's generic handlers: no generated code, nothing of TensorFlow.
"""
from __future__ import annotations

import atexit
import collections
import concurrent.futures
import copy
import dataclasses
import json
import os
import signal
import sys
import threading
import time
from typing import Dict, List, Optional, Tuple

# grpc's C core logs a line when the driver's server goes away; that is expected here.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
# With fork support on, every fork (subprocess with preexec_fn, here and in TensorFlow) stops
# and restarts grpc's pollers, which races with them: 'epoll_wait error: Bad file descriptor',
# then SIGABRT, in about one process in five. Our children exec at once and never use grpc.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc  # noqa: E402

from runner.process import GRACE_SECONDS  # noqa: E402

CONTROL_ENV = "PARALLAX_CONTROL"  # JSON: address, job, name, timeout (see Heartbeat.from_env)
_BEAT = "/parallax.Control/Beat"


def _encode(message) -> bytes:
    return json.dumps(message).encode()


def _decode(data: bytes):
    return json.loads(data.decode())


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

    def add(self, other: "Progress") -> None:
        """Count `other`'s new steps, their time and its scalars in this one too."""
        self.new_steps += other.new_steps
        self.step_seconds += other.step_seconds
        for name, (value, count) in other.scalars.items():
            total = self.scalars.setdefault(name, [0.0, 0])
            total[0] += value
            total[1] += count


@dataclasses.dataclass
class _Status:
    started: float
    last_beat: Optional[float] = None
    exiting_since: Optional[float] = None  # it said it is exiting (its atexit handlers run)
    progress: Progress = dataclasses.field(default_factory=Progress)  # the latest
    since_taken: Progress = dataclasses.field(default_factory=Progress)  # summed since then


class ControlServer:
    """The driver's side. `names` are the job's processes; `workers` those that run steps."""

    def __init__(self, job: str, names: List[str], workers: List[str], heartbeat_timeout: float,
                 stall_timeout: float):
        self.job = job
        self.heartbeat_timeout = heartbeat_timeout
        self.stall_timeout = stall_timeout
        self.workers = list(workers)
        self._lock = threading.Lock()
        now = time.monotonic()
        self._status = {name: _Status(started=now) for name in names}
        self._server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.method_handlers_generic_handler("parallax.Control", {
            "Beat": grpc.unary_unary_rpc_method_handler(
                self._beat, request_deserializer=_decode, response_serializer=_encode)})
        self._server.add_generic_rpc_handlers((handler,))
        self.port = self._server.add_insecure_port("[::]:0")
        self._server.start()

    def env_for(self, name: str, address: str) -> Dict[str, str]:
        """What process `name` needs to reach this server at `address` (an address of this
        machine that its host can route to)."""
        host = f"[{address}]" if ":" in address else address
        return {CONTROL_ENV: json.dumps({"address": f"{host}:{self.port}", "job": self.job,
                                         "name": name, "timeout": self.heartbeat_timeout})}

    def _beat(self, request, _context):
        if request.get("job") != self.job or request.get("name") not in self._status:
            return {"ok": False, "reason": "not a process of this job"}
        with self._lock:
            status = self._status[request["name"]]
            status.last_beat = time.monotonic()
            if request.get("exiting"):
                status.exiting_since = status.last_beat
            if request.get("progress"):
                progress = status.progress = Progress(**request["progress"])
                status.since_taken.steps = progress.steps
                status.since_taken.add(progress)
        return {"ok": True}

    def take_progress(self) -> Dict[str, Progress]:
        """Each worker's progress since the last call: its steps so far, and the time of its
        new steps and the reported scalars summed."""
        with self._lock:
            taken = {name: self._status[name].since_taken for name in self.workers}
            for name, progress in taken.items():
                self._status[name].since_taken = Progress(steps=progress.steps)
        return taken

    def check(self, exited=frozenset()) -> Optional[str]:
        """Why the job must be stopped now, or None: a process that stopped beating (of those
        not `exited`), workers stuck in a step for longer than the stall timeout, or a mark
        one worker made and another passed (on the last beats too, which workers send as they
        exit)."""
        now = time.monotonic()
        slow_limit = 2 * self.heartbeat_timeout + 30  # starting and exiting take longer
        with self._lock:
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
            return self._stall(exited) or self._unmatched_mark()

    def _unmatched_mark(self) -> Optional[str]:
        """A mark one worker made after a step that another worker passed without making it.
        Each beat is one worker's state at one moment: what a worker made after fewer steps
        than it has finished is final, so two workers are compared up to the fewer steps.
        Each mark is compared once with the worker that made it most often at that step."""
        progress = {name: self._status[name].progress for name in self.workers}
        counts = {name: {what: collections.Counter(at) for what, at in p.marks.items()}
                  for name, p in progress.items()}
        for what, step, first, most in self._marks_by_step(counts):
            for second, theirs in progress.items():
                if (step < min(progress[first].steps, theirs.steps)
                        and counts[second].get(what, {}).get(step, 0) < most):
                    when = f"after its step {step}" if step else "before its first step"
                    return (f"{first} {what} {when} and {second} did not, going on to step "
                            f"{step + 1}: the workers no longer train the same model. Every "
                            "worker must run the same sequence of runs")
        return None

    @staticmethod
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

    def _stall(self, exited) -> Optional[str]:
        progress = {name: self._status[name].progress for name in self.workers
                    if name not in exited and self._status[name].exiting_since is None}
        stuck = {name: p for name, p in progress.items()
                 if p.in_run_seconds is not None and p.in_run_seconds > self.stall_timeout}
        if not stuck:
            return None
        # Those not in that step (they have not finished more steps than the stuck ones) are
        # the ones the others wait for.
        step = max(p.steps for p in stuck.values())
        behind = [f"{name} (step {p.steps}, " + ("not in a run)" if p.in_run_seconds is None
                                                  else f"in a run for {p.in_run_seconds:.0f} s)")
                  for name, p in progress.items() if name not in stuck and p.steps <= step]
        waiting = ", ".join(f"{name} (step {p.steps + 1})" for name, p in stuck.items())
        message = (f"stalled: {waiting} in a step for more than {self.stall_timeout:g} s "
                   "(stall_timeout_secs)")
        message += (f"; behind: {', '.join(behind)}" if behind
                    else "; every worker is in it (a server or the network does not answer)")
        return message + (". Workers wait for each other in every step: each must run the "
                          "same sequence of training runs")

    def stop(self) -> None:
        self._server.stop(grace=None)


class Heartbeat:
    """The process's side: a daemon thread that beats every few seconds with the progress the
    process records, and stops this process when the driver has not answered for the timeout
    (or says this process is not part of its job)."""

    def __init__(self, address: str, job: str, name: str, timeout: float):
        self._request = {"job": job, "name": name}
        self._timeout = timeout
        self._interval = max(0.2, min(2.0, timeout / 5))
        self._lock = threading.Lock()
        self._progress = Progress()
        self._run_started: Optional[float] = None
        self._exit_announced = False
        self._channel = grpc.insecure_channel(address)
        self._call = self._channel.unary_unary(_BEAT, request_serializer=_encode,
                                               response_deserializer=_decode)
        threading.Thread(target=self._loop, name="parallax-heartbeat", daemon=True).start()

    @classmethod
    def from_env(cls) -> Optional["Heartbeat"]:
        text = os.environ.get(CONTROL_ENV)
        if not text:
            return None
        del os.environ[CONTROL_ENV]  # this process's own: not for processes it starts
        settings = json.loads(text)
        return cls(settings["address"], settings["job"], settings["name"], settings["timeout"])

    def run_started(self) -> None:
        with self._lock:
            self._run_started = time.monotonic()

    def run_finished(self, training_step: bool, scalars: Dict[str, float],
                     mark: Optional[str] = None) -> None:
        """`mark`: what this run did that every worker must do at the same point of its
        steps (the driver compares them), said as the driver's message says it."""
        with self._lock:
            if mark is not None:
                self._progress.marks.setdefault(mark, []).append(self._progress.steps)
            elapsed = time.monotonic() - (self._run_started or time.monotonic())
            self._run_started = None
            if training_step:
                self._progress.steps += 1
                self._progress.new_steps += 1
                self._progress.step_seconds += elapsed
            for name, value in scalars.items():
                total = self._progress.scalars.setdefault(name, [0.0, 0])
                total[0] += float(value)
                total[1] += 1

    def announce_exit(self) -> None:
        """Tell the driver when this process starts exiting (it stops beating, and may take a
        while): registered with atexit now, it runs before the handlers registered earlier,
        such as Horovod's shutdown."""
        if not self._exit_announced:
            self._exit_announced = True
            atexit.register(self._exiting)

    def _exiting(self) -> None:
        try:
            self._call(dict(self._request, exiting=True, progress=self._take_progress()),
                       timeout=2.0)
        except grpc.RpcError:
            pass

    def _take_progress(self) -> dict:
        with self._lock:
            progress = self._progress
            if self._run_started is not None:
                progress.in_run_seconds = time.monotonic() - self._run_started
            self._progress = Progress(steps=progress.steps, marks=copy.deepcopy(progress.marks))
        return dataclasses.asdict(progress)

    def _give_back(self, taken: dict) -> None:
        """Progress a beat that failed could not deliver goes with the next one."""
        with self._lock:
            self._progress.add(Progress(**taken))

    def _loop(self) -> None:
        answered = time.monotonic()
        while True:
            started = time.monotonic()
            progress = self._take_progress()
            try:
                reply = self._call(dict(self._request, progress=progress),
                                   timeout=self._interval * 2)
            except Exception:  # pylint: disable=broad-except  (this thread must go on beating)
                reply = None
                self._give_back(progress)
            if reply is not None and not reply.get("ok"):
                self._stop_process(f"the driver says: {reply.get('reason')}")
                return
            if reply is not None:
                answered = time.monotonic()
            elif time.monotonic() - answered > self._timeout:
                self._stop_process(f"no answer from the driver for "
                                   f"{time.monotonic() - answered:.0f} s")
                return
            time.sleep(max(0.0, self._interval - (time.monotonic() - started)))

    def _stop_process(self, why: str) -> None:
        """SIGTERM to this process (the chief saves a checkpoint), then SIGKILL to its group:
        the driver is gone, so nobody else will stop it."""
        print(f"parallax: {why}: stopping {self._request['name']}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(GRACE_SECONDS)
        if os.getpgrp() == os.getpid():  # a group of its own: what it started, too
            os.killpg(os.getpgrp(), signal.SIGKILL)
        else:
            os.kill(os.getpid(), signal.SIGKILL)


_heartbeat: Optional[Heartbeat] = None


def start_heartbeat() -> Optional[Heartbeat]:
    """This process's heartbeat, started on first use when the driver set CONTROL_ENV."""
    global _heartbeat
    if _heartbeat is None:
        _heartbeat = Heartbeat.from_env()
    return _heartbeat
