"""A process's side of the control plane: `Heartbeat`, a daemon thread that calls the driver's
control server (runner/control_server.py) every few seconds with the process's progress. A
process whose driver stops answering (killed, paused, or on the other side of a partition)
stops itself within the heartbeat timeout; its watchdog process (runner/watchdog.py) kills it
if it cannot, so nothing outlives its job on any host. An answer is the driver's only when
signed with the job's key for that very beat (runner/beat_signing.py): whoever else answers,
the process does not obey."""
from __future__ import annotations

import atexit
import copy
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, Optional

from runner.beat_message import Progress
from runner.beat_signing import ANSWER, MAC_BYTES, encode_beat, verified
from runner.control_transport import BeatChannel
from runner.process import GRACE_SECONDS

_CONTROL_ENV = "PARALLAX_CONTROL"  # JSON: address, job, name, timeout, key
_WATCHDOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "watchdog.py")


class Heartbeat:
    """Beats every few seconds with the progress the process records, and stops this process
    when the driver has not answered for `timeout`; its watchdog kills it when it has not
    stopped GRACE_SECONDS later."""

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
        # Started before grpc's channel: grpc's threads and a fork do not mix
        # (runner/control_transport.py).
        self._watchdog = _start_watchdog(timeout + GRACE_SECONDS + 1, name)
        self._channel = BeatChannel(address)
        threading.Thread(target=self._loop, name="parallax-heartbeat", daemon=True).start()

    @staticmethod
    def env_for(address: str, job: str, name: str, timeout: float, key: bytes
                ) -> Dict[str, str]:
        """The environment of process `name` of job `job`, for its `from_env`."""
        return {_CONTROL_ENV: json.dumps({"address": address, "job": job, "name": name,
                                         "timeout": timeout, "key": key.hex()})}

    @classmethod
    def from_env(cls) -> Optional["Heartbeat"]:
        text = os.environ.get(_CONTROL_ENV)
        if not text:
            return None
        del os.environ[_CONTROL_ENV]  # this process's own: not for processes it starts
        settings = json.loads(text)
        return cls(settings["address"], settings["job"], settings["name"], settings["timeout"],
                   bytes.fromhex(settings["key"]))

    def _send(self, message: dict, timeout: float) -> Optional[dict]:
        """The driver's answer to `message`, or None: no answer, or one it did not sign for
        this very beat."""
        with self._lock:
            self._sequence += 1
            sequence = self._sequence
        message = dict(self._request, sequence=sequence, **message)
        data = self._channel.call(encode_beat(self._key, message), timeout=timeout)
        if data is None:
            return None
        body = verified(self._key, ANSWER, data)
        try:
            answer = json.loads(body if body is not None else data[MAC_BYTES:])
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
        subprocess.Popen([sys.executable, "-I", _WATCHDOG, str(seconds), name], stdin=read,
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
