"""The job's progress as the driver shows it: a tqdm bar on its terminal (global step, steps/s,
the reported scalars averaged over workers) and a metrics file of the same, one JSON object a
line (`time`, `step`, `steps_per_sec`, `step_seconds`, one key per reported scalar, and
`attempt` after a restart, which counts time and steps from 0 again):
`python -m runner.progress METRICS_FILE IMAGE.png` plots it."""
from __future__ import annotations

import json
import sys
import threading
import time
from typing import Dict, Optional

from tqdm import tqdm

from runner.beat_message import Progress
from runner.control_server import ControlServer


def summarize(progress: Dict[str, Progress]) -> dict:
    """One record of the workers' progress since the last one: the global step is the number
    of steps every worker has finished; scalars are the mean over workers of each one's mean."""
    record = {"step": min((p.steps for p in progress.values()), default=0)}
    new_steps = sum(p.new_steps for p in progress.values())
    if new_steps:
        record["step_seconds"] = sum(p.step_seconds for p in progress.values()) / new_steps
    names = sorted({name for p in progress.values() for name in p.scalars})
    for name in names:
        means = [p.scalars[name][0] / p.scalars[name][1] for p in progress.values()
                 if p.scalars.get(name, [0, 0])[1]]
        record[name] = sum(means) / len(means)
    return record


class ProgressDisplay:
    def __init__(self, control: ControlServer, metrics_file: Optional[str], bar: bool,
                 interval: float = 1.0, attempt: int = 0):
        self._control = control
        self._attempt = attempt  # a restarted job counts its steps from 0 again
        self._interval = interval
        self._metrics = open(metrics_file, "a") if metrics_file else None
        self._bar = tqdm(unit="step", dynamic_ncols=True, file=sys.stderr) if bar else None
        self._stopped = threading.Event()
        self._started = time.monotonic()
        self._last = (self._started, 0)
        self._thread = threading.Thread(target=self._loop, name="parallax-progress", daemon=True)
        self._thread.start()

    def write_line(self, line: bytes) -> None:
        """A line of a process's output, written without breaking the bar."""
        if self._bar is None:
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
            return
        with tqdm.external_write_mode(file=sys.stdout):
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()

    def _loop(self) -> None:
        while not self._stopped.wait(self._interval):
            self._update_or_stop()

    def _update_or_stop(self) -> None:
        """Progress is a view of the job: when it fails (a full disk under the metrics file),
        it stops, the job goes on."""
        try:
            self._update()
        except Exception as error:  # pylint: disable=broad-except
            self._stopped.set()
            print(f"parallax: progress display stopped: {error!r}", file=sys.stderr)

    def _update(self) -> None:
        record = summarize(self._control.take_progress())
        now = time.monotonic()
        last_time, last_step = self._last
        if record["step"] == last_step and len(record) == 1:
            return  # nothing new to show or write
        record["steps_per_sec"] = (record["step"] - last_step) / (now - last_time)
        self._last = (now, record["step"])
        record["time"] = round(now - self._started, 3)
        if self._attempt:
            record["attempt"] = self._attempt
        if self._metrics is not None:
            self._metrics.write(json.dumps(record) + "\n")
            self._metrics.flush()
        if self._bar is not None:
            self._bar.update(record["step"] - self._bar.n)
            self._bar.set_postfix({k: f"{v:.4g}" for k, v in record.items()
                                   if k not in ("step", "time", "steps_per_sec")}, refresh=True)

    def close(self) -> None:
        already_stopped = self._stopped.is_set()
        self._stopped.set()
        self._thread.join()
        if not already_stopped:
            self._update_or_stop()
        if self._bar is not None:
            self._bar.close()
        if self._metrics is not None:
            self._metrics.close()


def plot(metrics_file: str, image: str) -> None:
    """Draw a metrics file: each recorded value against the global step, one panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(metrics_file) as lines:
        records = [json.loads(line) for line in lines if line.strip()]
    names = sorted({k for r in records for k in r} - {"step", "time", "attempt"})
    figure, axes = plt.subplots(len(names), 1, sharex=True, squeeze=False,
                                figsize=(7, 2.2 * len(names)))
    for axis, name in zip(axes[:, 0], names):
        points = [(r["step"], r[name]) for r in records if name in r]
        axis.plot([s for s, _ in points], [v for _, v in points], marker=".")
        axis.set_ylabel(name)
    axes[-1, 0].set_xlabel("global step")
    figure.tight_layout()
    figure.savefig(image)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m runner.progress METRICS_FILE IMAGE.png")
    plot(sys.argv[1], sys.argv[2])
