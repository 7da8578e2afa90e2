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
from typing import Dict, List, Optional, Sequence

from runner.ssh import SSHConfig, environment_line, forwarded_env

GRACE_SECONDS = 3.0
# After a failure, how long other processes may take to fail on their own before they are
# stopped. A process that raised can exit after the peers its failure brought down (its
# interpreter teardown is slow), so the report shows every failure in this window.
FAILURE_WINDOW_SECONDS = 3.0
TAIL_LINES = 20
_PR_SET_PDEATHSIG = 1


@dataclasses.dataclass
class ProcessSpec:
    name: str  # shown as the '[name]' prefix of every output line and in errors
    argv: List[str]
    env: Dict[str, str]  # set on top of the driver's environment (what ssh forwards, remotely)
    cwd: Optional[str] = None
    host: Optional[str] = None  # a remote host to run on through ssh; None: this machine
    ssh: Optional[SSHConfig] = None
    log_file: Optional[str] = None  # output goes here instead of the driver's stdout
    service: bool = False  # serves the others (a parameter server): the job does not wait for
    # it to finish, stops it at the end, and fails if it exits before then


class JobFailed(RuntimeError):
    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def _die_with_parent():
    # A child outlives a SIGKILLed driver unless the kernel is told to signal it.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class _Process:
    def __init__(self, spec: ProcessSpec, output_lock: threading.Lock, exits: queue.Queue):
        self.spec = spec
        self.tail = collections.deque(maxlen=TAIL_LINES)
        self._lock = output_lock
        log = open(spec.log_file, "ab") if spec.log_file else None
        if spec.host is None:
            argv, env, cwd, stdin = spec.argv, dict(os.environ, **spec.env), spec.cwd, None
        else:
            # The environment goes down this pipe first; then the remote side stops when the
            # pipe closes, i.e. when ssh goes away.
            argv = spec.ssh.command(spec.host, spec.argv, spec.cwd)
            env, cwd, stdin = None, None, subprocess.PIPE
        self.popen = subprocess.Popen(
            argv, env=env, cwd=cwd, stdin=stdin or subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_die_with_parent)
        if spec.host is not None:
            self.popen.stdin.write(environment_line(
                forwarded_env(spec.env, spec.ssh.forward_env)))
            self.popen.stdin.flush()
        self.reader = threading.Thread(target=self._pump, args=(log,), daemon=True)
        self.reader.start()
        # One waiter per process puts exits in the order they happen, so the job reports the
        # process that failed first, not one that failed because of it.
        threading.Thread(target=lambda: exits.put((self, self.popen.wait())), daemon=True).start()

    def _pump(self, log):
        prefix = f"[{self.spec.name}] ".encode()
        try:
            for line in iter(self.popen.stdout.readline, b""):
                self.tail.append(line.decode(errors="replace").rstrip("\n"))
                if log is not None:
                    log.write(line)
                    log.flush()
                    continue
                with self._lock:
                    sys.stdout.buffer.write(prefix + line)
                    sys.stdout.buffer.flush()
        finally:
            if log is not None:
                log.close()

    def signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.popen.pid, signum)
        except ProcessLookupError:
            pass


def run_processes(specs: Sequence[ProcessSpec], poll_seconds: float = 0.1,
                  timeout: Optional[float] = None) -> None:
    """Start every process and wait for all; raise JobFailed when the job does not succeed,
    or has not finished after `timeout` seconds."""
    stop_signal = []
    previous = {sig: signal.signal(sig, lambda signum, _: stop_signal.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    lock, exits = threading.Lock(), queue.Queue()
    processes: List[_Process] = []
    try:
        for spec in specs:
            processes.append(_Process(spec, lock, exits))
        job_deadline = None if timeout is None else time.monotonic() + timeout
        failure = _wait(sum(not p.spec.service for p in processes), exits, stop_signal,
                        poll_seconds, job_deadline)
    finally:
        _stop_all(processes)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failure is not None:
        raise failure


def _wait(running: int, exits: queue.Queue, stop_signal: list, poll_seconds: float,
          job_deadline: Optional[float]):
    failures = []
    deadline = None
    while running and (deadline is None or time.monotonic() < deadline):
        if stop_signal:
            name = signal.Signals(stop_signal[0]).name
            return JobFailed(f"stopped by {name}: every process was terminated",
                             128 + stop_signal[0])
        if job_deadline is not None and time.monotonic() > job_deadline and not failures:
            return JobFailed("timed out: every process was terminated", 124)
        try:
            process, code = exits.get(timeout=poll_seconds)
        except queue.Empty:
            continue
        running -= not process.spec.service
        if code != 0 or process.spec.service:
            process.reader.join(timeout=2)
            failures.append((process, code))
            deadline = deadline or time.monotonic() + FAILURE_WINDOW_SECONDS
    if not failures:
        return None
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
        if process.spec.host is not None and code == 255:
            status += f" (ssh could not reach or lost {process.spec.host})"
        statuses.append(f"{process.spec.name} {status}")
        tail = "\n".join(f"    {line}" for line in process.tail) or "    (no output)"
        tails.append(f"Last lines of {process.spec.name}:\n{tail}")
    return "; ".join(statuses) + "; the other processes were stopped.\n" + "\n".join(tails)


def _stop_all(processes: List[_Process]) -> None:
    alive = [p for p in processes if p.popen.poll() is None]
    for process in alive:
        process.signal_group(signal.SIGTERM)
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
