"""The job's control plane, on gRPC: the driver serves `ControlServer`; every process it starts
runs a `Heartbeat` thread that calls it every few seconds with the process's progress.

The driver learns that a process is alive (a SIGSTOPped or cut-off process stops beating: the
job is stopped, naming it), how far each worker is (a job whose workers sit in a step that does
not end is a deadlock: the job is stopped, naming the workers that are behind), what each worker
did that all must do at the same point of their steps (a restore from a checkpoint: a worker
that trains on without it no longer trains the same model, and the job is stopped, naming both),
what the user asked to report (a loss), for its progress bar and metrics file, and digests of
values each worker saw that the driver compares across workers (its first step's input: all
equal is a dataset nobody sharded). A process
whose driver stops answering (killed, paused, or on the other side of a partition) stops itself
within the heartbeat timeout; its watchdog process (runner/watchdog.py) kills it if it cannot,
so nothing outlives its job on any host.

A job obeys only its owner. The driver makes a key for each attempt of the job and gives it to
each process in its environment (over the ssh channel, never on a command line or the wire).
Every beat carries an HMAC-SHA256 of its body and a sequence number that only grows; every
answer, an HMAC of its own body, which repeats the beat's number. The driver refuses, logs and
otherwise ignores a beat that is forged, replayed, too large or not of the schema (`_checked`);
a process ignores an answer it cannot verify. The service runs on grpc's asyncio server,
listening on the driver's address towards the hosts only: a client that opens calls and never
sends their message holds coroutines, not the few threads a synchronous server has, and cannot
delay the real beats.

Messages are JSON over gRPC's generic handlers: no generated code, nothing of TensorFlow.
"""
from __future__ import annotations

import asyncio
import atexit
import collections
import copy
import dataclasses
import hashlib
import hmac
import json
import math
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

# grpc's C core logs a line when the driver's server goes away; that is expected here.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
# With fork support on, every fork (subprocess with preexec_fn, here and in TensorFlow) stops
# and restarts grpc's pollers, which races with them: 'epoll_wait error: Bad file descriptor',
# then SIGABRT, in about one process in five. Our children exec at once and never use grpc.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc  # noqa: E402

from runner.process import GRACE_SECONDS  # noqa: E402

CONTROL_ENV = "PARALLAX_CONTROL"  # JSON: address, job, name, timeout, key (Heartbeat.from_env)
_BEAT = "/parallax.Control/Beat"
MAX_MESSAGE_BYTES = 64 * 1024  # a beat is a few hundred bytes; marks and scalars add little
MAX_DIGESTS = 64
_MAC_BYTES = hashlib.sha256().digest_size
_UNSIGNED = bytes(_MAC_BYTES)  # the MAC of a refusal to a client not of the job
SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_concurrent_streams", 16),  # per connection
    # A connection, with the calls it holds open, ends after a minute (a real process's
    # channel reconnects at once); a call gets 5 s more to finish.
    ("grpc.max_connection_age_ms", 60_000),
    ("grpc.max_connection_age_grace_ms", 5_000),
    ("grpc.so_reuseport", 0),  # no other process may bind the port beside this one
]
_CLIENT_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
REFUSALS_LOGGED_EVERY_SECONDS = 10.0
PAUSE_SECONDS = 1.0  # between two checks of ControlServer.check: the driver was not running


def encode_beat(key: bytes, beat: dict) -> bytes:
    """A beat's bytes on the wire: its MAC with the job's key, then its JSON."""
    return _signed(key, b"beat", beat)


def _signed(key: bytes, purpose: bytes, message: dict) -> bytes:
    body = json.dumps(message).encode()
    return _mac(key, purpose, body) + body


def _mac(key: bytes, purpose: bytes, body: bytes) -> bytes:
    # `purpose` keeps a beat from passing for an answer, or an answer for a beat.
    return hmac.new(key, purpose + b"\0" + body, hashlib.sha256).digest()


def _verified(key: bytes, purpose: bytes, data: bytes) -> Optional[bytes]:
    """The body of `data` if its MAC is right, else None."""
    mac, body = data[:_MAC_BYTES], data[_MAC_BYTES:]
    return body if hmac.compare_digest(mac, _mac(key, purpose, body)) else None


class Refused(ValueError):
    """A beat the driver does not act on, and why."""


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
        _expect(isinstance(message, dict) and set(message) <= _PROGRESS_FIELDS,
                "progress is not an object of Progress's fields")
        progress = cls(**message)
        _expect(_count(progress.steps) and _count(progress.new_steps), "steps: not counts")
        _expect(_seconds(progress.step_seconds), "step_seconds: not seconds")
        _expect(progress.in_run_seconds is None or _seconds(progress.in_run_seconds),
                "in_run_seconds: not seconds")
        _expect(isinstance(progress.scalars, dict) and all(
            isinstance(value, list) and len(value) == 2 and _float(value[0])
            and _count(value[1]) for value in progress.scalars.values()),
            "scalars: not name: [sum, count]")
        _expect(isinstance(progress.marks, dict) and all(
            isinstance(at, list) and all(_count(step) for step in at)
            for at in progress.marks.values()), "marks: not name: [steps]")
        _expect(isinstance(progress.digests, dict) and len(progress.digests) <= MAX_DIGESTS
                and all(isinstance(name, str) and len(name) <= 200 and isinstance(digest, str)
                        and len(digest) <= 64 for name, digest in progress.digests.items()),
                "digests: not name: digest")
        progress.step_seconds = float(progress.step_seconds)
        progress.scalars = {name: [float(value), count]
                            for name, (value, count) in progress.scalars.items()}
        return progress


_PROGRESS_FIELDS = {field.name for field in dataclasses.fields(Progress)}


def _expect(condition: bool, why: str) -> None:
    if not condition:
        raise Refused(why)


def _count(value) -> bool:
    return type(value) is int and value >= 0  # pylint: disable=unidiomatic-typecheck  (not bool)


def _float(value) -> bool:  # a reported loss may be NaN
    return type(value) in (int, float)  # pylint: disable=unidiomatic-typecheck  (not bool)


def _number(value) -> bool:
    return _float(value) and math.isfinite(value)


def _seconds(value) -> bool:
    return _number(value) and value >= 0


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
        self.key = secrets.token_bytes(32)
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
        self.port = asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result()

    async def _serve(self) -> int:
        self._server = grpc.aio.server(options=SERVER_OPTIONS)
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "parallax.Control", {"Beat": grpc.unary_unary_rpc_method_handler(self._beat)}),))
        port = self._server.add_insecure_port(f"{self._host}:0")
        await self._server.start()
        return port

    def env_for(self, name: str) -> Dict[str, str]:
        """What process `name` needs to reach this server and prove that it is of the job."""
        return {CONTROL_ENV: json.dumps({
            "address": f"{self._host}:{self.port}", "job": self.job, "name": name,
            "timeout": self.heartbeat_timeout, "key": self.key.hex()})}

    async def _beat(self, request: bytes, context) -> bytes:
        return self.receive(request, context.peer())

    def receive(self, request: bytes, peer: str = "this process") -> bytes:
        """Acts on a beat's bytes as they came from `peer`: the answer's bytes."""
        try:
            beat = self._checked(request)
        except Refused as refusal:
            self._refuse(peer, str(refusal))
            return _UNSIGNED + json.dumps({"ok": False, "reason": str(refusal)}).encode()
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
        return _signed(self.key, b"answer", {"ok": True, "sequence": beat["sequence"]})

    def _checked(self, request: bytes) -> dict:
        """The beat in `request`, authenticated, new and of the schema; else Refused."""
        body = _verified(self.key, b"beat", request)
        _expect(body is not None, "not signed with the job's key")
        try:
            beat = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nested too deep
            raise Refused("not JSON") from None
        _expect(isinstance(beat, dict) and set(beat) <= {
            "job", "name", "sequence", "exiting", "progress"}, "not a beat")
        _expect(beat.get("job") == self.job, "of another job")
        _expect(isinstance(beat.get("name"), str) and beat["name"] in self._status,
                "from a process not of this job")
        _expect(_count(beat.get("sequence")), "sequence: not a count")
        _expect(isinstance(beat.get("exiting", False), bool), "exiting: not true or false")
        if beat.get("progress") is not None:
            beat["progress"] = Progress.from_message(beat["progress"])
        with self._lock:
            _expect(beat["sequence"] > self._status[beat["name"]].sequence,
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
        not `exited`), workers stuck in a step for longer than the stall timeout, or a mark
        one worker made and another passed (on the last beats too, which workers send as they
        exit)."""
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
        asyncio.run_coroutine_threadsafe(self._server.stop(None), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


class Heartbeat:
    """The process's side: a daemon thread that beats every few seconds with the progress the
    process records, and stops this process when the driver has not answered for the timeout
    (an answer is the driver's only when signed with the job's key, for that beat); and a
    watchdog process that kills it when it has not stopped GRACE_SECONDS later
    (runner/watchdog.py)."""

    def __init__(self, address: str, job: str, name: str, timeout: float, key: bytes):
        self._request = {"job": job, "name": name}
        self._key = key
        self._sequence = 0
        self._timeout = timeout
        self._interval = max(0.2, min(2.0, timeout / 5))
        self._lock = threading.Lock()
        self._progress = Progress()
        self._run_started: Optional[float] = None
        self.digests_reported = False
        self._refusal: Optional[str] = None  # the last unsigned refusal, for the stop's reason
        # Started before grpc's channel: grpc's threads and a fork do not mix (see above).
        self._watchdog = _start_watchdog(timeout + GRACE_SECONDS + 1, name)
        self._channel = grpc.insecure_channel(address, options=_CLIENT_OPTIONS)
        self._call = self._channel.unary_unary(_BEAT)
        threading.Thread(target=self._loop, name="parallax-heartbeat", daemon=True).start()

    @classmethod
    def from_env(cls) -> Optional["Heartbeat"]:
        text = os.environ.get(CONTROL_ENV)
        if not text:
            return None
        del os.environ[CONTROL_ENV]  # this process's own: not for processes it starts
        settings = json.loads(text)
        return cls(settings["address"], settings["job"], settings["name"], settings["timeout"],
                   bytes.fromhex(settings["key"]))

    def _send(self, message: dict, timeout: float) -> Optional[dict]:
        """The driver's answer to `message`, or None: no answer, or one it did not sign for
        this very beat (whoever else answers, this process does not obey)."""
        with self._lock:
            self._sequence += 1
            sequence = self._sequence
        message = dict(self._request, sequence=sequence, **message)
        try:
            data = self._call(encode_beat(self._key, message), timeout=timeout)
        except grpc.RpcError:
            return None
        body = _verified(self._key, b"answer", data)
        try:
            answer = json.loads(body if body is not None else data[_MAC_BYTES:])
        except ValueError:
            return None
        if body is None or not isinstance(answer, dict) or answer.get("sequence") != sequence:
            self._refusal = str(answer.get("reason")) if isinstance(answer, dict) else None
            return None
        return answer

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

    def report_digests(self, digests: Dict[str, str]) -> None:
        """Digests of values this process saw (hex, by name), for the driver to compare with
        the other workers'; only the first report counts."""
        with self._lock:
            if not self.digests_reported:
                self.digests_reported = True
                self._progress.digests = dict(digests)

    def announce_exit(self) -> None:
        """Tell the driver when this process starts exiting (it stops beating, and may take a
        while): registered with atexit now (again, after a process joins Horovod again), it
        runs before the handlers registered earlier, such as Horovod's shutdown."""
        atexit.unregister(self._exiting)
        atexit.register(self._exiting)

    def _exiting(self) -> None:
        try:
            self._send({"exiting": True, "progress": self._take_progress()}, timeout=2.0)
        except Exception:  # pylint: disable=broad-except  (at exit: nothing to report it to)
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
                reply = self._send({"progress": progress}, timeout=self._interval * 2)
            except Exception:  # pylint: disable=broad-except  (this thread must go on beating)
                reply = None
            if reply is None:
                self._give_back(progress)
            else:
                answered = time.monotonic()
                self._refusal = None
                _feed(self._watchdog)
            if time.monotonic() - answered > self._timeout:
                refused = (f" (its answers were refusals: {self._refusal})" if self._refusal
                           else "")
                self._stop_process(f"no answer from the driver for "
                                   f"{time.monotonic() - answered:.0f} s{refused}")
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


def _start_watchdog(seconds: float, name: str) -> int:
    """Starts this process's watchdog (runner/watchdog.py), in its process group: the pipe's
    end that feeds it."""
    read, write = os.pipe()  # both close on exec: only the watchdog gets `read`, as stdin
    try:
        subprocess.Popen([sys.executable, "-I", WATCHDOG, str(seconds), name], stdin=read,
                         stdout=subprocess.DEVNULL)
    finally:
        os.close(read)
    os.set_blocking(write, False)  # a stopped watchdog must not stop the heartbeat
    return write


def _feed(watchdog: int) -> None:
    try:
        os.write(watchdog, b".")
    except OSError:  # gone or full: the heartbeat alone stops this process
        pass


WATCHDOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "watchdog.py")
