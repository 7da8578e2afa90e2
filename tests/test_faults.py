"""Faults on the emulated cluster (two hosts, two workers each): a process that stops answering,
a host cut off and reconnected, a killed remote_exec, a killed driver, a closed stdout. Each
test asserts how long the job took to end, its exit code, that the culprit is named, and that
nothing of the job is left on any host. The measured times are printed as a table at the end
of the module (run with -s to see it)."""
import os
import signal
import subprocess
import threading
import time

import psutil
import pytest

from conftest import WORKLOADS
from runner.process import DRIVER_PAUSED_EXIT, GRACE_SECONDS
from emulated import (HOSTS, RESOURCES, assert_hosts_idle, cluster,  # noqa: F401
                      namespace_pids, processes, pytestmark, start, wait_for)

pytestmark = [pytestmark, pytest.mark.job]

HEARTBEAT = 10.0  # Config.heartbeat_timeout_secs of these jobs
PAUSE_RUNS = int(os.environ.get("PARALLAX_TEST_PAUSE_RUNS", "1"))  # 5 for the report
SCRIPT = os.path.join(WORKLOADS, "supervised.py")
TIMINGS = []


@pytest.fixture(scope="module", autouse=True)
def timings_table():
    yield
    print("\n| fault | mode | job ended after | exit code | culprit named | host clean after |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in TIMINGS:
        print("| " + " | ".join(row) + " |")


def _job(cluster, run_option, mode="hang", **popen):
    env = dict(cluster, PARALLAX_TEST_HEARTBEAT_SECS=str(HEARTBEAT))
    driver, token = start(env, SCRIPT, mode, RESOURCES, "", "sparse", run_option, **popen)
    return driver, token


def _clean_after(token, since, timeout=30.0, driver=None):
    """Seconds from `since` until no process of the job (but its `driver`) is left anywhere."""
    deadline = time.monotonic() + timeout

    def left():
        return [p for p in processes(token) if driver is None or p.pid != driver.pid]

    while left():
        assert time.monotonic() < deadline, f"left: {[p.cmdline() for p in left()]}"
        time.sleep(0.2)
    return time.monotonic() - since


def _record(fault, mode, ended, code, named, clean):
    TIMINGS.append((fault, mode, f"{ended:.1f} s", str(code), named, f"{clean:.1f} s"))


# Each kind of process once: a server, a worker in Horovod (AR), one without (PS). HYBRID's
# processes are of these kinds (its paused-driver test below has them all).
@pytest.mark.parametrize("role,run_option", [("server", "HYBRID"), ("worker", "AR"),
                                             ("worker", "PS")])
def test_a_stopped_process_is_named_and_the_job_stopped(cluster, role, run_option):
    driver, token = _job(cluster, run_option)
    wait_for(driver.stdout, " ready", 4)
    victim = processes(token, role, host=2)[-1]
    victim.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    output = driver.communicate(timeout=120)[0]
    ended = time.monotonic() - stopped
    assert driver.returncode == 124, output[-3000:]
    named = f"{HOSTS[1]}:{role}:"
    assert f"{named}" in output and "sent no heartbeat" in output, output[-3000:]
    assert HEARTBEAT <= ended < HEARTBEAT + 12
    clean = _clean_after(token, stopped)
    assert_hosts_idle()
    _record(f"SIGSTOP of a {role}", run_option, ended, driver.returncode, named, clean)


@pytest.mark.parametrize("run", range(PAUSE_RUNS))
def test_a_paused_driver_leaves_nothing_running_and_blames_nobody(cluster, run):
    """SIGSTOP of the driver for twice the heartbeat timeout: every process on every host
    (HYBRID's: servers, workers in Horovod and on servers) stops itself meanwhile (its
    watchdog kills it if it cannot); after SIGCONT the driver says that it was itself not
    running, with its own exit code."""
    driver, token = _job(cluster, "HYBRID")
    wait_for(driver.stdout, " ready", 4)
    driver.send_signal(signal.SIGSTOP)
    paused = time.monotonic()
    try:
        clean = _clean_after(token, paused, timeout=2 * HEARTBEAT, driver=driver)
        assert clean < HEARTBEAT + GRACE_SECONDS + 2
        assert_hosts_idle(timeout=5)
        time.sleep(max(0.0, paused + 2 * HEARTBEAT - time.monotonic()))
    finally:
        driver.send_signal(signal.SIGCONT)
    output = driver.communicate(timeout=60)[0]
    ended = time.monotonic() - paused
    assert driver.returncode == DRIVER_PAUSED_EXIT, output[-3000:]
    assert "this driver was not running for 2" in output, output[-3000:]
    assert not any(blame in output for blame in ("no heartbeat", "exited with", "killed by"))
    _record("SIGSTOP of the driver for 20 s, then SIGCONT", "HYBRID", ended,
            driver.returncode, "the driver itself", clean)


def test_a_host_cut_off_stops_the_job_and_itself(cluster):
    driver, token = _job(cluster, "HYBRID")
    wait_for(driver.stdout, " ready", 4)
    link = "pxv2"  # the bridge end of the second host's link
    subprocess.run(["ip", "link", "set", link, "down"], check=True)
    cut = time.monotonic()
    try:
        output = driver.communicate(timeout=120)[0]
        ended = time.monotonic() - cut
        assert driver.returncode != 0 and HOSTS[1] in output, output[-3000:]
        assert ended < HEARTBEAT + 12
        # The cut-off host stops its processes by itself, link still down.
        clean = _clean_after(token, cut, timeout=HEARTBEAT + 15)
    finally:
        subprocess.run(["ip", "link", "set", link, "up"], check=True)
    # Its ssh sessions end once the link is back (the driver's end is gone).
    assert_hosts_idle(timeout=90)
    _record("link of a host down (then up)", "HYBRID", ended, driver.returncode, HOSTS[1], clean)


def test_killing_remote_exec_stops_the_job_and_its_child(cluster):
    driver, token = _job(cluster, "HYBRID")
    wait_for(driver.stdout, " ready", 4)
    # remote_exec's own environment is its ssh session's: found by its command line.
    remote_execs = [p for p in map(psutil.Process, namespace_pids(2))
                    if "runner.remote_exec" in " ".join(p.cmdline())
                    and SCRIPT in p.cmdline()]
    remote_execs[0].kill()
    killed = time.monotonic()
    output = driver.communicate(timeout=120)[0]
    ended = time.monotonic() - killed
    named = f"{HOSTS[1]}:worker:"
    assert driver.returncode != 0 and named in output, output[-3000:]
    assert ended < 15
    clean = _clean_after(token, killed)
    assert_hosts_idle()
    _record("SIGKILL of remote_exec", "HYBRID", ended, driver.returncode, named, clean)


def test_killing_the_driver_leaves_nothing_on_any_host(cluster):
    driver, token = _job(cluster, "HYBRID")
    wait_for(driver.stdout, " ready", 4)
    driver.kill()
    killed = time.monotonic()
    driver.wait()
    clean = _clean_after(token, killed, timeout=HEARTBEAT + 15)
    assert_hosts_idle()
    _record("SIGKILL of the driver", "HYBRID", 0.0, driver.returncode, "-", clean)


def test_a_closed_stdout_stops_the_job(cluster):
    driver, token = _job(cluster, "HYBRID", mode="talk", stderr=subprocess.PIPE)
    errors = []
    threading.Thread(target=lambda: errors.extend(driver.stderr), daemon=True).start()
    try:
        wait_for(driver.stdout, " step ", 5)  # as `| head -n 5` reads, then goes
    except AssertionError as error:
        driver.wait(timeout=60)
        raise AssertionError(f"{error}\nstderr:\n{''.join(errors)[-3000:]}") from None
    driver.stdout.close()
    closed = time.monotonic()
    driver.wait(timeout=60)
    ended = time.monotonic() - closed
    assert driver.returncode == 128 + signal.SIGPIPE, "".join(errors)[-3000:]
    assert any("output was closed (broken pipe)" in line for line in errors)
    assert ended < 15
    clean = _clean_after(token, closed)
    assert_hosts_idle()
    _record("stdout closed (| head)", "HYBRID", ended, driver.returncode, "-", clean)
