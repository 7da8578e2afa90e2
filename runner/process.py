"""Run a job's processes together: stream their output, and stop them all as one.

The job's rule: it succeeds when every process exits 0, services (parameter servers) aside:
they run until the others are done. The first process that fails, or a Ctrl-C / SIGTERM to the
driver, stops every other process (SIGTERM to its process group, then SIGKILL after a grace
period), so nothing is left running.
"""
from __future__ import annotations

import collections
import ctypes
import dataclasses
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Union

from runner.output import PAST_STARTUP, OutputFilter
from runner.slurm import SrunConfig
from runner.ssh import SSHConfig, environment_line, forwarded_env

GRACE_SECONDS = 5.0  # from SIGTERM to SIGKILL: time for a last checkpoint
# After a failure, how long other processes may take to fail on their own before they are
# stopped. A process that raised can exit after the peers its failure brought down (its
# interpreter teardown is slow), so the report shows every failure in this window.
FAILURE_WINDOW_SECONDS = 3.0
TAIL_LINES = 20
# The driver's exit status when it was itself not running (stopped, suspended) for longer than
# its processes can wait for it: they stop themselves, and none of them is to blame. 75 is
# sysexits' EX_TEMPFAIL: the job may be run again.
DRIVER_PAUSED_EXIT = 75
_PR_SET_PDEATHSIG = 1


@dataclasses.dataclass
class ProcessSpec:
    name: str  # shown as the '[name]' prefix of every output line and in errors
    argv: List[str]
    env: Dict[str, str]  # set on top of the driver's environment (what ssh forwards, remotely)
    cwd: Optional[str] = None
    host: Optional[str] = None  # a remote host to run on; None: this machine
    remote: Union[SSHConfig, SrunConfig, None] = None  # how: over ssh, or as a Slurm step
    log_file: Optional[str] = None  # output goes here instead of the driver's stdout
    service: bool = False  # serves the others (a parameter server): the job does not wait for
    # it to finish, stops it at the end, and fails if it exits before then
    hold_until_started: bool = False  # output before runner.output.PAST_STARTUP is dropped
    stop_first: bool = False  # when the job stops, stopped (and waited for) before the others,
    # which keep running meanwhile: the chief saving a checkpoint needs its peers


class JobFailed(RuntimeError):
    def __init__(self, message: str, exit_code: int, by_user: bool = False):
        super().__init__(message)
        self.exit_code = exit_code
        self.by_user = by_user  # stopped on purpose (a signal, a closed output): not to retry


# Resolved here, in the parent: after a fork of a process with threads (grpc's, the output
# pumps) the child may only call what is already loaded, not dlopen.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def die_with_parent():
    """In a child between fork and exec: the kernel sends it SIGTERM when its parent dies
    (a child outlives a SIGKILLed parent otherwise)."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def write_stdout(line: bytes) -> None:
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()


class _Output:
    """Where the processes' lines go, one at a time; closed once writing fails (the reader of
    the driver's stdout went away, as `| head` does)."""

    def __init__(self, write: Callable[[bytes], None]):
        self._write = write
        self._lock = threading.Lock()
        self.closed = threading.Event()

    def write(self, line: bytes) -> None:
        with self._lock:
            if self.closed.is_set():
                return
            try:
                self._write(line)
            except (BrokenPipeError, ValueError):  # ValueError: the file object was closed
                self.closed.set()


class _Process:
    def __init__(self, spec: ProcessSpec, output: _Output, exits: queue.Queue):
        self.spec = spec
        self.tail = collections.deque(maxlen=TAIL_LINES)
        self._output = output
        log = open(spec.log_file, "ab") if spec.log_file else None
        if spec.host is None:
            argv, env, cwd, stdin = spec.argv, dict(os.environ, **spec.env), spec.cwd, None
        else:
            # The environment goes down this pipe first; then the remote side stops when the
            # pipe closes, i.e. when ssh (or srun) goes away.
            argv = spec.remote.command(spec.host, spec.argv, spec.cwd)
            env, cwd, stdin = None, None, subprocess.PIPE
        self.popen = subprocess.Popen(
            argv, env=env, cwd=cwd, stdin=stdin or subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=die_with_parent)
        if spec.host is not None:
            try:
                self.popen.stdin.write(environment_line(
                    forwarded_env(spec.env, spec.remote.forward_env)))
                self.popen.stdin.flush()
            except BrokenPipeError:
                pass  # ssh or srun is gone already: its exit status and output tell why
        self.reader = threading.Thread(target=self._pump, args=(log,), daemon=True)
        self.reader.start()
        # One waiter per process puts exits in the order they happen, so the job reports the
        # process that failed first, not one that failed because of it.
        threading.Thread(target=lambda: exits.put((self, self.popen.wait())), daemon=True).start()

    def _pump(self, log):
        prefix = f"[{self.spec.name}] ".encode()
        shown = OutputFilter(self.spec.hold_until_started)

        def show(lines):
            for kept in lines:
                self.tail.append(kept.decode(errors="replace").rstrip("\n"))
                if log is None:
                    self._output.write(prefix + kept)

        try:
            for line in iter(self.popen.stdout.readline, b""):
                if log is not None and line != PAST_STARTUP:  # the log keeps every line
                    log.write(line)
                    log.flush()
                show(shown.feed(line))
            show(shown.finish())
        finally:
            if log is not None:
                log.close()

    def stop(self) -> None:
        """SIGTERM, here or (closing the connection's stdin) on the remote host."""
        if self.spec.host is None:
            self.signal_group(signal.SIGTERM)
            return
        try:
            self.popen.stdin.close()
        except OSError:
            pass

    def signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.popen.pid, signum)
        except ProcessLookupError:
            pass


def run_processes(specs: Sequence[ProcessSpec], poll_seconds: float = 0.1,
                  timeout: Optional[float] = None,
                  watchdog: Optional[Callable[[set], Optional[str]]] = None,
                  write: Callable[[bytes], None] = write_stdout,
                  pause_limit: Optional[float] = None) -> None:
    """Start every process and wait for all; raise JobFailed when the job does not succeed,
    has not finished after `timeout` seconds, or `watchdog` (called every poll with the names
    of the processes that have exited, and once more when all have) says why it must stop;
    or when this driver was not running (SIGSTOP, a suspend) for `pause_limit` seconds, which
    its processes may not have survived: whatever they did then is not theirs to answer for
    (DRIVER_PAUSED_EXIT). Output lines go to `write`."""
    stop_signal = []
    previous = {sig: signal.signal(sig, lambda signum, _: stop_signal.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    output, exits = _Output(write), queue.Queue()
    processes: List[_Process] = []
    try:
        for spec in specs:
            processes.append(_Process(spec, output, exits))
        job_deadline = None if timeout is None else time.monotonic() + timeout
        failure = _wait(sum(not p.spec.service for p in processes), exits, stop_signal,
                        poll_seconds, job_deadline, watchdog or (lambda _: None), output,
                        _PauseClock(pause_limit))
    finally:
        _stop_all(processes)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failure is not None:
        raise failure


class _PauseClock:
    """Measures how long this driver was not running: the longest gap between two ticks."""

    def __init__(self, limit: Optional[float]):
        self.limit = limit
        self.longest = 0.0
        self._last = time.monotonic()

    def tick(self) -> bool:
        """Whether the driver was not running for `limit` seconds since the first tick."""
        now = time.monotonic()
        self.longest = max(self.longest, now - self._last)
        self._last = now
        return self.limit is not None and self.longest >= self.limit

    def failure(self) -> JobFailed:
        return JobFailed(
            f"this driver was not running for {self.longest:.0f} s (stopped or suspended), "
            "longer than its processes wait for it before they stop themselves: the job was "
            "stopped; none of its processes is to blame",
            DRIVER_PAUSED_EXIT)


def _wait(running: int, exits: queue.Queue, stop_signal: list, poll_seconds: float,
          job_deadline: Optional[float], watchdog, output: _Output, paused: _PauseClock):
    failures, exited = [], set()
    deadline = None
    while running and (deadline is None or time.monotonic() < deadline):
        if paused.tick():
            return paused.failure()
        if stop_signal:
            name = signal.Signals(stop_signal[0]).name
            return JobFailed(f"stopped by {name}: every process was terminated",
                             128 + stop_signal[0], by_user=True)
        if output.closed.is_set():
            return JobFailed("the driver's output was closed (broken pipe): every process "
                             "was terminated", 128 + signal.SIGPIPE, by_user=True)
        if not failures:
            if job_deadline is not None and time.monotonic() > job_deadline:
                return JobFailed("timed out: every process was terminated", 124)
            why = watchdog(exited)
            if why:
                return JobFailed(f"{why}; every process was terminated", 124)
        try:
            process, code = exits.get(timeout=poll_seconds)
        except queue.Empty:
            continue
        if paused.tick():  # before the exits of those that stopped themselves meanwhile
            return paused.failure()
        running -= not process.spec.service
        exited.add(process.spec.name)
        if code != 0 or process.spec.service:
            process.reader.join(timeout=2)
            failures.append((process, code))
            deadline = deadline or time.monotonic() + FAILURE_WINDOW_SECONDS
    if not failures:
        # The last beats, sent as the workers exit, may show what the job must fail for.
        why = watchdog(exited)
        return None if not why else JobFailed(why, 124)
    first_code = failures[0][1]
    return JobFailed(_failure_message(failures), first_code if first_code > 0 else 1)


def _failure_message(failures) -> str:
    statuses, tails = [], []
    for process, code in failures:
        if process.spec.host is not None and 128 < code < 128 + signal.NSIG:
            code = 128 - code  # runner.remote_exec reports a signal as the shells do
        status = (f"was killed by {signal.Signals(-code).name}" if code < 0
                  else f"exited with status {code}")
        if process.spec.service:
            status += " while the job was running"
        if isinstance(process.spec.remote, SSHConfig) and code == 255:
            status += (f" (ssh could not reach or lost {process.spec.host}, or its remote side "
                       "was killed)")
        statuses.append(f"{process.spec.name} {status}")
        tail = "\n".join(f"    {line}" for line in process.tail) or "    (no output)"
        tails.append(f"Last lines of {process.spec.name}:\n{tail}")
    return "; ".join(statuses) + "; the other processes were stopped.\n" + "\n".join(tails)


def _stop_all(processes: List[_Process]) -> None:
    for first in (True, False):
        alive = [p for p in processes if p.popen.poll() is None and p.spec.stop_first == first]
        for process in alive:
            process.stop()
        deadline = time.monotonic() + GRACE_SECONDS
        for process in alive:
            try:
                process.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    for process in processes:
        # The group may hold grandchildren even after its leader exited.
        process.signal_group(signal.SIGKILL)
        process.popen.wait()
        process.reader.join(timeout=2)
