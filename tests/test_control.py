"""The control plane (runner.control), the output filter and the progress records, on real
local processes and a real gRPC server; nothing here needs TensorFlow."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import psutil
import pytest

from runner.control import ControlServer, Progress
from runner.link_probe import probe
from runner.output import PAST_STARTUP, OutputFilter
from runner.process import GRACE_SECONDS, JobFailed, ProcessSpec, run_processes
from runner.progress import ProgressDisplay, plot, summarize
from runner.ssh import SSHConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A process of a job: beats, then runs 'steps' of 0.05 s (reporting a loss), then sleeps.
BEATING = """
import sys, time
from runner.control import start_heartbeat
beat = start_heartbeat()
for step in range(int(sys.argv[1])):
    beat.run_started(); time.sleep(0.05); beat.run_finished(True, {"loss": float(sys.argv[2])})
if sys.argv[3] == "stuck":
    beat.run_started()
time.sleep(600)
"""

# A worker that runs 'steps' steps, marks 'restored' before step 'mark_at' (never when -1),
# then sleeps 'then' seconds and exits.
MARKING = """
import sys, time
from runner.control import start_heartbeat
beat = start_heartbeat()
beat.announce_exit()
steps, mark_at, then = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
for step in range(steps):
    if step == mark_at:
        beat.run_started(); beat.run_finished(False, {}, mark="restored")
    beat.run_started(); time.sleep(0.05); beat.run_finished(True, {})
time.sleep(then)
"""


def _job(names, workers, heartbeat=2.0, stall=60.0):
    return ControlServer(uuid.uuid4().hex, names, workers, heartbeat, stall)


def _spec(control, name, *args):
    env = dict(control.env_for(name, "127.0.0.1"), PYTHONPATH=REPO)
    return ProcessSpec(name, [sys.executable, "-c", BEATING, *map(str, args)], env=env,
                       cwd=REPO)


def _leftovers():
    return [c for c in psutil.Process().children(recursive=True)
            if "start_heartbeat" in " ".join(c.cmdline())]


@pytest.mark.job
def test_a_stopped_process_is_named_and_the_job_stopped():
    control = _job(["h:worker:0", "h:worker:1"], ["h:worker:0", "h:worker:1"])
    specs = [_spec(control, name, 1000, 1.0, "") for name in control.workers]

    def stop_worker_1():
        time.sleep(3)
        stopped = [c for c in psutil.Process().children() if "h:worker:1" in c.environ().get(
            "PARALLAX_CONTROL", "")]
        stopped[0].send_signal(signal.SIGSTOP)

    threading.Thread(target=stop_worker_1, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(JobFailed) as failure:
        run_processes(specs, watchdog=control.check)
    control.stop()
    assert "h:worker:1 sent no heartbeat" in str(failure.value)
    assert failure.value.exit_code == 124
    # Noticed 2 s after the stop; the stopped process ignores SIGTERM until SIGKILL.
    assert 3 + 2 <= time.monotonic() - started < 3 + 2 + GRACE_SECONDS + 3
    assert _leftovers() == []


@pytest.mark.job
def test_workers_stuck_in_a_step_are_a_stall_naming_the_one_behind():
    control = _job(["h:worker:0", "h:worker:1"], ["h:worker:0", "h:worker:1"], stall=3.0)
    specs = [_spec(control, "h:worker:0", 5, 1.0, "stuck"),  # waits in step 6 for worker 1
             _spec(control, "h:worker:1", 4, 1.0, "")]  # never starts step 5
    with pytest.raises(JobFailed) as failure:
        run_processes(specs, watchdog=control.check)
    control.stop()
    message = str(failure.value)
    assert "stalled: h:worker:0 (step 6) in a step" in message
    assert "behind: h:worker:1 (step 4, not in a run)" in message
    assert _leftovers() == []


def _marking(control, marks_at, then):
    return [ProcessSpec(name, [sys.executable, "-c", MARKING, "6", str(at), str(then)],
                        env=dict(control.env_for(name, "127.0.0.1"), PYTHONPATH=REPO), cwd=REPO)
            for name, at in zip(control.workers, marks_at)]


@pytest.mark.job
def test_workers_that_mark_the_same_step_finish():
    control = _job(["h:worker:0", "h:worker:1"], ["h:worker:0", "h:worker:1"])
    run_processes(_marking(control, [2, 2], 0), watchdog=control.check)
    control.stop()


@pytest.mark.job
def test_a_mark_one_worker_made_and_another_passed_fails_the_job_at_its_end():
    """Horovod's habit of restoring in rank 0 alone: a job too short for a beat between the
    steps fails on the beats its workers send as they exit."""
    control = _job(["h:worker:0", "h:worker:1"], ["h:worker:0", "h:worker:1"])
    with pytest.raises(JobFailed) as failure:
        run_processes(_marking(control, [2, -1], 0), watchdog=control.check)
    control.stop()
    assert str(failure.value).startswith(
        "h:worker:0 restored after its step 2 and h:worker:1 did not, going on to step 3: "
        "the workers no longer train the same model")
    assert failure.value.exit_code == 124


@pytest.mark.job
def test_a_mark_one_worker_made_and_another_passed_stops_the_job_while_it_runs():
    control = _job(["h:worker:0", "h:worker:1"], ["h:worker:0", "h:worker:1"])
    started = time.monotonic()
    with pytest.raises(JobFailed) as failure:
        run_processes(_marking(control, [-1, 0], 600), watchdog=control.check)
    control.stop()
    assert "h:worker:1 restored before its first step and h:worker:0 did not" in str(
        failure.value)
    assert time.monotonic() - started < 30  # a beat or two, not the job's 600 s
    assert _leftovers() == [] and not [c for c in psutil.Process().children(recursive=True)
                                       if "mark_at" in " ".join(c.cmdline())]


def test_marks_are_compared_with_the_worker_that_made_them_most_often():
    """A restore run twice after one step by two workers and once by the third; a mark made
    after a step the others have not passed yet is not compared yet."""
    names = ["h:worker:0", "h:worker:1", "h:worker:2"]
    control = _job(names, names)

    def beat(name, steps, marks):
        control._beat({"job": control.job, "name": name,
                       "progress": {"steps": steps, "marks": marks}}, None)

    try:
        beat("h:worker:0", 5, {"restored": [2, 2]})
        beat("h:worker:1", 5, {"restored": [2, 2, 5]})
        beat("h:worker:2", 5, {"restored": [2, 2]})
        assert control.check() is None  # nobody has passed step 5 yet
        beat("h:worker:2", 5, {"restored": [2]})
        assert control.check().startswith(
            "h:worker:0 restored after its step 2 and h:worker:2 did not, going on to step 3")
    finally:
        control.stop()


@pytest.mark.job
def test_a_process_whose_driver_is_gone_stops_itself():
    control = _job(["h:server:0"], [], heartbeat=2.0)
    spec = _spec(control, "h:server:0", 0, 0.0, "")
    child = subprocess.Popen(spec.argv, env=dict(os.environ, **spec.env), cwd=REPO,
                             stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    control.stop()
    gone = time.monotonic()
    _, stderr = child.communicate(timeout=30)
    assert time.monotonic() - gone < 2.0 + 3
    assert child.returncode == -signal.SIGTERM
    assert "no answer from the driver" in stderr


@pytest.mark.job
def test_a_process_of_another_job_stops_itself():
    control = _job(["h:worker:0"], ["h:worker:0"])
    other = _job(["h:worker:0"], ["h:worker:0"])
    spec = _spec(other, "h:worker:0", 0, 0.0, "")
    spec.env.update(control.env_for("h:worker:0", "127.0.0.1"))
    spec.env["PARALLAX_CONTROL"] = spec.env["PARALLAX_CONTROL"].replace(control.job, "stale")
    child = subprocess.run(spec.argv, env=dict(os.environ, **spec.env), cwd=REPO,
                           capture_output=True, text=True, timeout=30)
    control.stop()
    other.stop()
    assert child.returncode == -signal.SIGTERM
    assert "not a process of this job" in child.stderr


@pytest.mark.job
def test_progress_is_the_global_step_and_scalars_averaged_over_workers():
    control = _job(["h:worker:0", "h:worker:1"], ["h:worker:0", "h:worker:1"])
    specs = [_spec(control, "h:worker:0", 10, 1.0, ""), _spec(control, "h:worker:1", 6, 3.0, "")]
    records = []

    def watch(exited):
        records.append(summarize(control.take_progress()))
        return "enough" if len(records) > 40 else None

    with pytest.raises(JobFailed, match="enough"):
        run_processes(specs, watchdog=watch)
    control.stop()
    assert max(r["step"] for r in records) == 6  # finished by every worker
    losses = [r["loss"] for r in records if "loss" in r]
    assert losses and all(1.0 <= loss <= 3.0 for loss in losses)
    assert summarize({"a": Progress(steps=3, new_steps=2, step_seconds=1.0,
                                    scalars={"loss": [4.0, 2]}),
                      "b": Progress(steps=2, new_steps=2, step_seconds=3.0,
                                    scalars={"loss": [1.0, 1]})}) == {
        "step": 2, "step_seconds": 1.0, "loss": 1.5}


@pytest.mark.job
def test_a_closed_output_stops_the_job():
    def broken(_line):
        raise BrokenPipeError(32, "Broken pipe")

    talker = [sys.executable, "-c", "import time\nwhile True: print('x', flush=True); "
              "time.sleep(0.1)"]
    started = time.monotonic()
    with pytest.raises(JobFailed, match="broken pipe") as failure:
        run_processes([ProcessSpec("talker", talker, env={})], write=broken)
    assert failure.value.exit_code == 128 + signal.SIGPIPE and failure.value.by_user
    assert time.monotonic() - started < 10
    assert not [c for c in psutil.Process().children(recursive=True)
                if "print('x'" in " ".join(c.cmdline())]


def test_lines_before_startup_are_dropped_unless_the_worker_fails_before_it():
    started = OutputFilter(hold_until_started=True)
    assert started.feed(b"banner\n") == []
    assert started.feed(PAST_STARTUP) == []
    assert started.feed(b"step 1\n") == [b"step 1\n"]
    assert started.finish() == []
    failed = OutputFilter(hold_until_started=True)
    assert failed.feed(b"banner\n") == [] and failed.feed(b"ImportError: x\n") == []
    assert failed.finish() == [b"banner\n", b"ImportError: x\n"]


def test_horovod_shutdown_tracebacks_fold_into_one_line_others_stay_whole():
    traceback = [b"Traceback (most recent call last):\n", b'  File "job.py", line 3\n',
                 b"    runner.run(train_op)\n"]
    horovod = OutputFilter(hold_until_started=False)
    for line in traceback:
        assert horovod.feed(line) == []
    horovod.feed(b"tensorflow.python.framework.errors_impl.UnknownError: Horovod has been "
                 b"shut down. This was caused by an exception on one of the ranks\n")
    folded = horovod.finish()
    assert len(folded) == 1 and b"folded" in folded[0] and b"Horovod has been shut" in folded[0]
    other = OutputFilter(hold_until_started=False)
    shown = [line for raw in traceback + [b"ValueError: mine\n"] for line in other.feed(raw)]
    assert shown + other.finish() == traceback + [b"ValueError: mine\n"]


@pytest.mark.job
def test_a_beating_process_can_fork():
    """grpc's fork support raced with its pollers (SIGABRT at start in about one process in
    five, as TensorFlow and subprocess fork): runner.control turns it off."""
    control = _job(["h:worker:0"], ["h:worker:0"])
    forks = ("from runner.control import start_heartbeat\nimport subprocess\n"
             "start_heartbeat()\nfor _ in range(300):\n"
             "    subprocess.run(['true'], preexec_fn=lambda: None)\n")
    env = dict(os.environ, PYTHONPATH=REPO, **control.env_for("h:worker:0", "127.0.0.1"))
    env.pop("GRPC_ENABLE_FORK_SUPPORT", None)
    for _ in range(2):
        child = subprocess.run([sys.executable, "-c", forks], env=env, cwd=REPO,
                               capture_output=True, text=True, timeout=120)
        assert child.returncode == 0 and "epoll" not in child.stderr, child.stderr[-2000:]
    control.stop()


@pytest.mark.job
def test_the_progress_bar_and_metrics_file_follow_the_workers(tmp_path, capsys):
    control = _job(["h:worker:0", "h:worker:1"], ["h:worker:0", "h:worker:1"], heartbeat=1.0)
    metrics = tmp_path / "metrics.jsonl"
    display = ProgressDisplay(control, str(metrics), bar=True, interval=0.2)
    specs = [_spec(control, name, 30, 2.0, "") for name in control.workers]

    def all_steps_recorded(_exited):
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        return "done" if lines and json.loads(lines[-1])["step"] == 30 else None

    with pytest.raises(JobFailed, match="done"):
        run_processes(specs, watchdog=all_steps_recorded, write=display.write_line)
    display.close()
    control.stop()
    bar = capsys.readouterr().err
    assert "30step" in bar.replace(" ", "") and "loss=2" in bar
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert records[-1]["step"] == 30 and records[-1]["time"] > records[0]["time"]
    plot(str(metrics), str(tmp_path / "progress.png"))
    assert (tmp_path / "progress.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.job
def test_the_link_probe_between_two_loopback_machines():
    link = probe("127.0.0.1", "127.0.0.2", SSHConfig())
    assert link["bandwidth"] > 10e6 and 0 < link["latency"] < 0.01
    assert not [c for c in psutil.Process().children(recursive=True)
                if "link_probe" in " ".join(c.cmdline())]
