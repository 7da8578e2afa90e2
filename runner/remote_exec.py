"""`python -m runner.remote_exec ARGV...`: run ARGV on a remote host for the driver, and stop
it, with everything it started, when the ssh connection (or srun) ends (stdin closes), or on
SIGTERM, SIGHUP or SIGINT. ssh alone would leave the remote process running when the driver
goes away. The first line of stdin is ARGV's environment (JSON), sent over the channel so that
no value appears on a command line."""
import json
import os
import signal
import subprocess
import sys
import threading

from runner.process import GRACE_SECONDS, die_with_parent


def main():
    env = dict(os.environ, **json.loads(sys.stdin.buffer.readline() or b"{}"))
    # Its child gets SIGTERM from the kernel even if this process is SIGKILLed.
    child = subprocess.Popen(sys.argv[1:], start_new_session=True, stdin=subprocess.DEVNULL,
                             env=env, preexec_fn=die_with_parent)
    stopping, asked = threading.Event(), threading.Event()

    def stop(*_):
        if stopping.is_set():
            return
        stopping.set()
        _signal_group(child.pid, signal.SIGTERM)
        threading.Timer(GRACE_SECONDS, _signal_group, (child.pid, signal.SIGKILL)).start()

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, stop)
    threading.Thread(target=lambda: (sys.stdin.buffer.read(), asked.set(), stop()),
                     daemon=True).start()
    code = child.wait()
    _signal_group(child.pid, signal.SIGKILL)  # whatever it started and left behind
    if asked.is_set() and code in (-signal.SIGTERM, -signal.SIGKILL, 128 + signal.SIGTERM):
        code = 0  # stopped as the driver asked (its stdin closed): srun reports no error
    os._exit(code if code >= 0 else 128 - code)


def _signal_group(pid, signum):
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    main()
