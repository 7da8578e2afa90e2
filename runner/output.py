"""What of a process's output reaches the driver's terminal.

- A worker re-runs the user's script from the top, so what the script prints before the job
  starts (before `get_runner` returns in a worker) the driver has printed already: such lines
  are held until the worker writes `PAST_STARTUP`, then dropped. A worker that ends without
  writing it failed before starting, and its held lines are shown.
- A Python traceback is held until the process's next line comes more than 2 s later or the
  process ends; one of Horovod's shutdown (what every other rank raises after one process
  failed) is then folded into the one line that says so.
"""
from __future__ import annotations

import collections
import re
import time
from typing import Deque, List

PAST_STARTUP = b"\x1eparallax: started\n"  # a line nobody prints by chance; written after
# a newline, so that a line left unfinished before it does not hide it
_HOROVOD_SHUTDOWN = re.compile(
    rb"Horovod has been shut down|HorovodInternalError|HorovodShutdown|"
    rb"gloo.*(Connection closed by peer|Connection reset|Timed out)|ranks finished execution")
HOLD_SECONDS, HOLD_LINES = 2.0, 400
_TRACEBACK_START = b"Traceback (most recent call last):"


class OutputFilter:
    def __init__(self, hold_until_started: bool):
        self._holding_startup = hold_until_started
        self._startup: Deque[bytes] = collections.deque(maxlen=HOLD_LINES)
        self._traceback: List[bytes] = []
        self._traceback_time = 0.0

    def feed(self, line: bytes) -> List[bytes]:
        """The lines to show now, given the process's next line."""
        if line == PAST_STARTUP:
            self._holding_startup = False
            self._startup.clear()
            return []
        if self._holding_startup:
            self._startup.append(line)
            return []
        if self._traceback:
            # A traceback is held until the process ends, as it does after Horovod's shutdown;
            # one that the process survives (it printed more later) is shown as it was.
            if (time.monotonic() - self._traceback_time < HOLD_SECONDS
                    and len(self._traceback) < HOLD_LINES):
                self._traceback.append(line)
                return []
            return self._flush_traceback() + self.feed(line)
        if line.startswith(_TRACEBACK_START):
            self._traceback, self._traceback_time = [line], time.monotonic()
            return []
        return [line]

    def finish(self) -> List[bytes]:
        """What is still held when the process's output ends."""
        return list(self._startup) + self._flush_traceback()

    def _flush_traceback(self) -> List[bytes]:
        held, self._traceback = self._traceback, []
        cause = next((line for line in held if _HOROVOD_SHUTDOWN.search(line)), None)
        if cause is None:
            return held
        return [b"(a traceback of Horovod's shutdown, folded) " + cause.strip()[:200] + b"\n"]
