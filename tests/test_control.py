"""The control plane (runner/control_server.py, heartbeat.py, step_agreement.py,
beat_message.py, beat_signing.py, control_transport.py), the output filter and the progress
records, on real local processes and a real gRPC server; nothing here needs TensorFlow."""
import collections
import contextlib
import hashlib
import hmac
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import grpc
import psutil
import pytest

from conftest import WORKLOADS, needs_horovod
from runner import step_agreement
from runner.beat_message import Progress
from runner.beat_signing import encode_beat
from runner.control_server import ControlServer
from runner.control_transport import MAX_MESSAGE_BYTES
from runner.link_probe import probe
from runner.output import PAST_STARTUP, OutputFilter
from runner.process import GRACE_SECONDS, JobFailed, ProcessSpec, run_processes
from runner.progress import ProgressDisplay, plot, summarize
from runner.ssh import SSHConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A process of a job: beats, then runs 'steps' of 0.05 s (reporting a loss), then sleeps.
BEATING = """
import sys, time
from runner.heartbeat import Heartbeat
beat = Heartbeat.from_env()
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
from runner.heartbeat import Heartbeat
beat = Heartbeat.from_env()
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
    env = dict(control.env_for(name), PYTHONPATH=REPO)
    return ProcessSpec(name, [sys.executable, "-c", BEATING, *map(str, args)], env=env,
                       cwd=REPO)


def _leftovers():
    return [c for c in psutil.Process().children(recursive=True)
            if any(word in " ".join(c.cmdline())
                   for word in ("Heartbeat.from_env", "watchdog.py"))]


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
                        env=dict(control.env_for(name), PYTHONPATH=REPO), cwd=REPO)
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

    sequence = iter(range(1, 100))

    def beat(name, steps, marks):
        control.receive(encode_beat(control.key, {
            "job": control.job, "name": name, "sequence": next(sequence),
            "progress": {"steps": steps, "marks": marks}}))

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


def test_workers_in_a_step_past_the_stall_timeout_name_those_they_wait_for():
    """The job-tier stall above, from the workers' last beats alone: a worker past the stuck
    one's step is not behind; all of them stuck is a server or the network."""
    progress = {"h:worker:0": Progress(steps=5, in_run_seconds=4.0),
                "h:worker:1": Progress(steps=4, in_run_seconds=1.0),
                "h:worker:2": Progress(steps=6)}
    message = step_agreement.stall(progress, 3.0)
    assert message.startswith("stalled: h:worker:0 (step 6) in a step for more than 3 s")
    assert "; behind: h:worker:1 (step 4, in a run for 1 s)." in message
    assert "h:worker:2" not in message and step_agreement.stall(progress, 5.0) is None
    assert "every worker is in it" in step_agreement.stall(
        {"h:worker:0": Progress(steps=1, in_run_seconds=9.0)}, 3.0)


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
def test_a_process_with_another_jobs_key_obeys_nobody_and_stops_itself():
    logged = []
    control = ControlServer(uuid.uuid4().hex, ["h:worker:0"], ["h:worker:0"], 2.0, 60.0,
                            log=logged.append)
    other = _job(["h:worker:0"], ["h:worker:0"])
    settings = json.loads(other.env_for("h:worker:0")["PARALLAX_CONTROL"])
    settings.update(address=f"127.0.0.1:{control.port}", job=control.job)
    started = time.monotonic()
    child = subprocess.run([sys.executable, "-c", BEATING, "0", "0", ""], cwd=REPO,
                           env=dict(os.environ, PYTHONPATH=REPO,
                                    PARALLAX_CONTROL=json.dumps(settings)),
                           capture_output=True, text=True, timeout=30)
    control.stop()
    other.stop()
    assert child.returncode == -signal.SIGTERM
    assert ("no answer from the driver for 2 s (its answers were refusals: not signed with the "
            "job's key)") in child.stderr
    assert 2.0 <= time.monotonic() - started < 2.0 + 5
    assert control.refused["not signed with the job's key"] >= 3
    assert len(logged) == 1 and "refused a beat from ipv4:127.0.0.1:" in logged[0]
    assert control.take_progress()["h:worker:0"].steps == 0


@pytest.mark.job
def test_a_process_its_heartbeat_cannot_stop_is_killed_by_its_watchdog():
    """Its main thread holds the GIL in C code forever (as a finalizer blocked in TensorFlow's
    C++ does) and it handles SIGTERM in Python: neither its heartbeat thread nor a SIGTERM
    can stop it once its driver is gone; its watchdog kills it."""
    blocked = ("import ctypes, signal, time\nfrom runner.heartbeat import Heartbeat\n"
               "Heartbeat.from_env()\nsignal.signal(signal.SIGTERM, lambda *_: None)\n"
               "time.sleep(1.5)\nctypes.PyDLL(None).pause()\n")
    control = _job(["h:worker:0"], ["h:worker:0"], heartbeat=2.0)
    child = subprocess.Popen([sys.executable, "-c", blocked], cwd=REPO, stderr=subprocess.PIPE,
                             env=dict(os.environ, PYTHONPATH=REPO, **control.env_for("h:worker:0")),
                             text=True, start_new_session=True)
    time.sleep(3)
    assert control.take_progress() and control.check() is None  # it beat, then blocked
    control.stop()
    gone = time.monotonic()
    _, stderr = child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL
    # Its last answer came as it blocked, 1.5 s before the driver went.
    assert time.monotonic() - gone < 2.0 + GRACE_SECONDS + 1 + 1
    assert "h:worker:0 did not stop itself: killing it" in stderr
    assert _leftovers() == []


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
    five, as TensorFlow and subprocess fork): runner.control_transport turns it off."""
    names = ["h:worker:0", "h:worker:1"]  # a process each: a second one of a name replays
    control = _job(names, names)
    forks = ("from runner.heartbeat import Heartbeat\nimport subprocess\n"
             "Heartbeat.from_env()\nfor _ in range(300):\n"
             "    subprocess.run(['true'], preexec_fn=lambda: None)\n")
    for name in names:
        env = dict(os.environ, PYTHONPATH=REPO, **control.env_for(name))
        env.pop("GRPC_ENABLE_FORK_SUPPORT", None)
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
    client, server = link["machines"]  # loopback addresses of one machine: one kernel
    assert client == server and client["kernel"] and client["cores"] >= 1
    assert not [c for c in psutil.Process().children(recursive=True)
                if "link_probe" in " ".join(c.cmdline())]


# The wire, as runner/beat_signing.py documents it: a beat is the HMAC-SHA256 of b"beat\0" + its
# JSON with the job's key, then the JSON; an answer the same with b"answer\0".
def _wire(key: bytes, purpose: bytes, body: bytes) -> bytes:
    return hmac.new(key, purpose + b"\0" + body, hashlib.sha256).digest() + body


def _beat(control, sequence, name="h:worker:0", **fields) -> bytes:
    return encode_beat(control.key, dict(job=control.job, name=name, sequence=sequence, **fields))


def _answer(control, data: bytes) -> dict:
    """The driver's answer to `data`; `signed`: whether its MAC is the job's for it."""
    answer = control.receive(data)
    body = answer[32:]
    return dict(json.loads(body), signed=answer == _wire(control.key, b"answer", body))


def test_a_beat_is_answered_signed_for_its_sequence():
    control = _job(["h:worker:0"], ["h:worker:0"])
    try:
        answer = _answer(control, _beat(control, 7, progress={"steps": 3, "new_steps": 3}))
        assert answer == {"ok": True, "sequence": 7, "signed": True}
        assert control.take_progress()["h:worker:0"].steps == 3
    finally:
        control.stop()


def test_digests_equal_on_every_worker_are_found_once_all_reported():
    """The first digests a worker reports count (the first training step's input); a job
    whose workers read different inputs, or one worker, has none in common."""
    workers = ["h:worker:0", "h:worker:1", "h:worker:2"]
    control = _job(workers + ["h:server:0"], workers)
    try:
        same = {"tf.data IteratorGetNext:0": "ab" * 16, "feed x:0": "cd" * 16}
        for sequence, name in enumerate(workers[:2], start=1):
            assert _answer(control, _beat(control, sequence, name, progress={
                "digests": same}))["ok"]
            assert control.identical_digests() is None  # not every worker has said
        _answer(control, _beat(control, 3, workers[2], progress={"digests": same}))
        assert control.identical_digests() == sorted(same)
        _answer(control, _beat(control, 4, workers[2], progress={
            "digests": {**same, "feed x:0": "ef" * 16}}))  # a later report changes nothing
        assert control.identical_digests() == sorted(same)
    finally:
        control.stop()
    control = _job(workers, workers)
    try:
        for sequence, name in enumerate(workers, start=1):
            _answer(control, _beat(control, sequence, name, progress={
                "digests": {"feed x:0": f"{sequence:032x}"}}))
        assert control.identical_digests() is None
    finally:
        control.stop()
    control = _job(workers[:1], workers[:1])
    try:
        _answer(control, _beat(control, 1, progress={"digests": same}))
        assert control.identical_digests() is None
    finally:
        control.stop()


def test_forged_and_replayed_beats_are_refused_logged_and_change_nothing():
    logged = []
    control = ControlServer(uuid.uuid4().hex, ["h:worker:0"], ["h:worker:0"], 2.0, 60.0,
                            log=logged.append)
    try:
        good = _beat(control, 1, progress={"steps": 3})
        assert _answer(control, good)["ok"]
        body = good[32:]
        forged = [b"", b"x" * 10, os.urandom(64), bytes(32) + body,
                  _wire(os.urandom(32), b"beat", body.replace(b'"steps": 3', b'"steps": 9')),
                  good[:32] + body.replace(b'"sequence": 1', b'"sequence": 2'),
                  _wire(control.key, b"answer", body.replace(b'"sequence": 1', b'"sequence": 2'))]
        for data in forged + [good]:  # good again: a replay
            answer = _answer(control, data)
            assert not answer["ok"] and not answer["signed"], data
        assert control.take_progress()["h:worker:0"].steps == 3
        assert control.refused == {"not signed with the job's key": len(forged),
                                   "a replay of a beat of h:worker:0": 1}
        assert len(logged) == 2 and "not signed with the job's key (1 so far)" in logged[0]
    finally:
        control.stop()


WRONG_BEATS = [
    [], "beat", {"name": "h:worker:0", "sequence": 2},  # no job
    {"sequence": 2, "name": "h:worker:9"}, {"sequence": 2, "name": ["h:worker:0"]},
    {"sequence": "2"}, {"sequence": True}, {"sequence": -1}, {"sequence": 2.5},
    {"sequence": 2, "exiting": "yes"}, {"sequence": 2, "other": 1},
    {"sequence": 2, "progress": []}, {"sequence": 2, "progress": {"unknown": 1}},
    {"sequence": 2, "progress": {"in_run_seconds": "x"}},
    {"sequence": 2, "progress": {"steps": -1}}, {"sequence": 2, "progress": {"steps": 1.5}},
    {"sequence": 2, "progress": {"steps": True}},
    {"sequence": 2, "progress": {"step_seconds": float("inf")}},
    {"sequence": 2, "progress": {"step_seconds": -1}},
    {"sequence": 2, "progress": {"scalars": {"loss": "x"}}},
    {"sequence": 2, "progress": {"scalars": {"loss": [1.0]}}},
    {"sequence": 2, "progress": {"scalars": []}},
    {"sequence": 2, "progress": {"marks": {"restored": ["x"]}}},
    {"sequence": 2, "progress": {"marks": {"restored": 3}}},
    {"sequence": 2, "progress": {"digests": ["x"]}},
    {"sequence": 2, "progress": {"digests": {"feed x:0": 3}}},
    {"sequence": 2, "progress": {"digests": {"feed x:0": "f" * 65}}},
    {"sequence": 2, "progress": {"digests": {str(i): "f" for i in range(65)}}},
]


def test_signed_beats_not_of_the_schema_are_refused_and_the_driver_goes_on():
    """What only a holder of the key could send: refused before use, never a crash (a beat
    with "in_run_seconds": "x" stopped the driver with a TypeError)."""
    control = _job(["h:worker:0"], ["h:worker:0"])
    try:
        assert _answer(control, _beat(control, 1))["ok"]
        bodies = [json.dumps(dict(job=control.job, name="h:worker:0", **wrong)
                             if isinstance(wrong, dict) and "name" not in wrong else wrong)
                  .encode() for wrong in WRONG_BEATS]
        bodies += [b"not json", b"[" * 30000 + b"]" * 30000, b'{"sequence": 2' * 3]
        for body in bodies:
            answer = _answer(control, _wire(control.key, b"beat", body))
            assert not answer["ok"] and not answer["signed"], body[:100]
            assert control.check() is None
        assert sum(control.refused.values()) == len(bodies)
        # Still the job's: a NaN loss is a loss; the next beat is taken.
        answer = _answer(control, _beat(control, 2, progress={
            "steps": 1, "new_steps": 1, "scalars": {"loss": [float("nan"), 1]}}))
        assert answer["ok"] and answer["signed"]
    finally:
        control.stop()


def test_half_open_and_oversized_calls_do_not_delay_real_beats():
    """100 calls that send their headers and never their message, on 10 connections, and
    messages over the size limit: a real beat is answered at once."""
    control = _job(["h:worker:0"], ["h:worker:0"])
    address = f"127.0.0.1:{control.port}"
    try:
        with _half_open_calls(address) as held:
            time.sleep(1.0)
            call = grpc.insecure_channel(address).unary_unary("/parallax.Control/Beat")
            with pytest.raises(grpc.RpcError) as oversized:
                call(b"x" * (MAX_MESSAGE_BYTES + 1), timeout=5)
            assert oversized.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            started = time.monotonic()
            answer = call(_beat(control, 1), timeout=5)
            assert time.monotonic() - started < 0.5
            assert json.loads(answer[32:]) == {"ok": True, "sequence": 1}
            assert not any(held_call.done() for held_call in held)  # all still open
    finally:
        control.stop()


@contextlib.contextmanager
def _half_open_calls(address, connections=10, each=10):
    """Calls that send their headers and never their message, held open until the end."""
    channels = [grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(connections)]
    release = threading.Event()

    def never():
        release.wait()
        yield b""

    try:
        yield [channel.stream_unary("/parallax.Control/Beat").future(never())
               for channel in channels for _ in range(each)]
    finally:
        release.set()
        for channel in channels:
            channel.close()


def _control_plane():
    return ControlServer(uuid.uuid4().hex, ["h:worker:0"], ["h:worker:0"], 2.0, 60.0,
                         address="127.0.0.2")


def _rendezvous():
    from runner.rendezvous import GlooRendezvous  # pylint: disable=C0415

    return GlooRendezvous([("127.0.0.2", 1)], "127.0.0.2")


@pytest.mark.parametrize("start", [_control_plane, pytest.param(_rendezvous,
                                                                marks=needs_horovod)])
def test_the_control_plane_and_rendezvous_listen_on_the_jobs_address_only(start):
    listener = start()
    try:
        listening = [c.laddr for c in psutil.Process().net_connections("inet")
                     if c.status == psutil.CONN_LISTEN]
        # grpc's socket is IPv6, bound to the IPv4-mapped address
        assert {ip.removeprefix("::ffff:") for ip, at in listening if at == listener.port} == {
            "127.0.0.2"}, listening
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", listener.port), timeout=2)
    finally:
        listener.stop()


@pytest.mark.collectives
@needs_horovod
def test_a_new_rendezvous_round_forgets_every_scope_and_obeys_only_the_jobs_ranks(
        monkeypatch):
    from runner import rendezvous as gloo_rendezvous  # pylint: disable=C0415

    GlooRendezvous = gloo_rendezvous.GlooRendezvous  # pylint: disable=C0103
    with GlooRendezvous([("127.0.0.1", 2), ("127.0.0.2", 2)], "127.0.0.1") as rendezvous:
        env = rendezvous.env_for_rank(3)

        def call(method, path, body=None):
            connection = http.client.HTTPConnection("127.0.0.1", rendezvous.port, timeout=10)
            connection.request(method, path, body)
            status = connection.getresponse().status
            connection.close()
            return status

        # What Horovod leaves behind: a scope whose keys outlive its round, a process set's.
        for path in ("/cross_1/rank_0", "/global_process_set_hash_1e9d/rank_2"):
            assert call("PUT", path, b"an old address") == 200
        assert call("DELETE", "/parallax_next_round/" + "0" * 32) == 403
        assert call("GET", "/cross_1/rank_0") == 200  # refused: nothing forgotten
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        gloo_rendezvous.next_round()
        for path in ("/cross_1/rank_0", "/global_process_set_hash_1e9d/rank_2"):
            assert call("GET", path) == 404
        assert call("PUT", "/global/rank_0", b"a new address") == 200  # a new round
        assert call("GET", "/global/rank_0") == 200


@pytest.mark.job
def test_a_live_job_trains_on_through_a_fuzz_of_its_control_plane():
    """Against a real job (HYBRID: servers, Horovod, two workers): 100 half-open calls held
    throughout, random bytes as calls and as raw TCP, calls over the size limit, and, signed
    with the job's key as if it had leaked, beats of the wrong schema and replays. The job
    trains to its end, the driver logs the refusals, and nobody is blamed."""
    env = dict(os.environ, PARALLAX_TEST_HEARTBEAT_SECS="5", PARALLAX_TEST_STEPS="300")
    driver = subprocess.Popen([sys.executable, os.path.join(WORKLOADS, "supervised.py"), "long",
                               "localhost:0,1", "", "sparse", "HYBRID"], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = []
    reader = threading.Thread(target=lambda: output.extend(driver.stdout), daemon=True)
    reader.start()
    settings, workers, deadline = None, [], time.monotonic() + 120
    while settings is None and time.monotonic() < deadline:
        for child in psutil.Process(driver.pid).children(recursive=True):
            try:
                text = child.environ().get("PARALLAX_CONTROL")
            except psutil.Error:
                continue
            if text and ":worker:" in json.loads(text)["name"]:
                settings = json.loads(text)
                workers.append(child)  # a launcher of the worker may hold its env too
        time.sleep(0.2)
    assert settings, "".join(output)[-3000:]
    key, address = bytes.fromhex(settings["key"]), settings["address"]
    # A beat signed with the key is the worker's until the worker's own first beat: the fuzz's
    # "replay" (sequence 1) sent before it would be taken, and the driver would then hold the
    # still-importing worker to the heartbeat timeout. So the fuzz starts once it beats.
    port = int(address.rsplit(":", 1)[1])
    while not _connected(workers, port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _connected(workers, port), "".join(output)[-3000:]
    time.sleep(1.0)  # its first beat answered

    def ended(within=10.0):
        try:
            driver.wait(timeout=within)
        except subprocess.TimeoutExpired:
            return False
        return True

    figures = _fuzz(address, key, settings["job"], settings["name"], ended)
    driver.wait(timeout=300)
    reader.join(timeout=10)
    text = "".join(output)
    print("\nfuzz of a live job's control plane:", figures)
    assert driver.returncode == 0, text[-3000:]
    assert text.count("done, loss") == 2
    assert "refused a beat" in text and "not signed with the job's key" in text
    assert "a replay" in text and "progress is not an object" in text
    assert not any(blame in text for blame in ("no heartbeat", "stalled", "never reached",
                                               "Traceback"))


def _connected(processes, port):
    """Whether one of `processes` holds a TCP connection to `port` (a heartbeat's channel)."""
    for process in processes:
        try:
            if any(c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
                   for c in process.net_connections("inet")):
                return True
        except psutil.Error:
            pass
    return False


def _fuzz(address, key, job, name, ended, seconds=15.0):
    """Bad clients for `seconds`, until `ended()`; what was sent, counted."""
    rng = random.Random(0)
    figures = collections.Counter()
    host, port = address.rsplit(":", 1)
    call = grpc.insecure_channel(address).unary_unary("/parallax.Control/Beat")
    deadline = time.monotonic() + seconds
    with _half_open_calls(address) as held:
        figures["half-open calls held"] = len(held)
        while time.monotonic() < deadline and not ended(0):
            kind = rng.choice(["bytes", "oversized", "tcp", "schema", "replay"])
            if kind == "bytes":
                data = rng.randbytes(rng.randrange(0, 4096))
            elif kind == "oversized":
                data = rng.randbytes(MAX_MESSAGE_BYTES + rng.randrange(1, 10 ** 6))
            elif kind == "tcp":
                try:
                    raw = socket.create_connection((host, int(port)), timeout=2)
                except ConnectionRefusedError:
                    if not ended():
                        raise
                    break  # the job ended (its control plane stops first): its driver says why
                with raw:
                    raw.sendall(rng.randbytes(rng.randrange(1, 4096)))
                figures["raw TCP connections of random bytes"] += 1
                continue
            elif kind == "schema":
                wrong = rng.choice(WRONG_BEATS)
                beat = (dict({"job": job, "name": name}, **wrong)
                        if isinstance(wrong, dict) and "name" not in wrong else wrong)
                data = _wire(key, b"beat", json.dumps(beat).encode())
            else:
                data = encode_beat(key, {"job": job, "name": name, "sequence": 1,
                                         "progress": {"steps": 10 ** 9}})
            try:
                call(data, timeout=5)
            except grpc.RpcError as error:
                figures[f"calls failed ({error.code().name})"] += 1
            figures[f"calls: {kind}"] += 1
    return dict(figures)


@pytest.mark.job
def test_the_link_probe_hangs_up_on_all_but_its_client():
    server = subprocess.Popen([sys.executable, "-m", "runner.link_probe", "serve", "127.0.0.1",
                               "192.0.2.1"], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        with socket.create_connection(("127.0.0.1", port), timeout=5) as stranger:
            stranger.sendall(b"p")
            try:
                assert stranger.recv(1) == b""  # hung up on, not answered
            except ConnectionResetError:  # hung up on with the ping unread
                pass
        assert server.poll() is None  # still waiting for its client
    finally:
        server.kill()
        server.wait()
