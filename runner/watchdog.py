"""`python -I runner/watchdog.py SECONDS NAME`: the backstop of a process's heartbeat
(runner/heartbeat.py), which starts it with a pipe as its stdin and writes a byte to it each time
the driver answers. When no byte has come for SECONDS, the process has lost its driver and has
not stopped itself — blocked in TensorFlow's C++ code, in interpreter shutdown or a finalizer,
its threads gone — and nothing inside it can stop it any more: the watchdog kills it, and its
process group when it leads one, with SIGKILL. It exits when the pipe closes (the process
exited) or the process is no longer its parent. Standalone (python -I): it must start in a few
milliseconds and can rely on nothing of the process it watches."""
import ctypes
import os
import select
import signal
import sys
import time

_PR_SET_PDEATHSIG = 1


def main() -> None:
    seconds, name = float(sys.argv[1]), sys.argv[2]
    watched = os.getppid()
    # Killed with its parent's thread that started it, whatever else the parent started holds
    # the pipe open (a fork without exec).
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    deadline = time.monotonic() + seconds
    while os.getppid() == watched:
        ready, _, _ = select.select([0], [], [], max(0.0, min(1.0, deadline - time.monotonic())))
        if ready:
            if not os.read(0, 4096):
                return  # the process exited
            deadline = time.monotonic() + seconds
        elif time.monotonic() >= deadline:
            _say(f"parallax: no answer from the driver for {seconds:.0f} s and {name} did "
                 "not stop itself: killing it\n")
            group = os.getpgid(watched) == watched
            (os.killpg if group else os.kill)(watched, signal.SIGKILL)
            return


def _say(line: str) -> None:
    """Writes to stderr, a pipe the paused driver may not be reading: for 1 s at most."""
    signal.signal(signal.SIGALRM, _give_up)
    signal.alarm(1)
    try:
        os.write(2, line.encode())
    except (OSError, TimeoutError):
        pass
    signal.alarm(0)


def _give_up(*_):
    raise TimeoutError  # a handler that returns would have the write retried (PEP 475)


if __name__ == "__main__":
    main()
