"""The emulated cluster for tests (scripts/emulated_cluster.sh): two hosts, each a network
namespace with its own address, hostname and sshd; helpers to start a job's driver there and
to find what is left of it on the hosts. Test modules import `cluster` (a module fixture) and
`pytestmark` (skips, saying why, where namespaces cannot be made)."""
import os
import subprocess
import sys
import time
import uuid

import numpy as np
import psutil
import pytest

from conftest import REPO, load_workload

equivalence = load_workload("equivalence")

CLUSTER_SCRIPT = os.path.join(REPO, "scripts", "emulated_cluster.sh")
STATE = "/tmp/parallax-test-cluster"
HOSTS = ["10.213.0.2", "10.213.0.3"]
RESOURCES = ";".join(f"{host}:0,1" for host in HOSTS)


def _cannot_make_namespaces():
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    # A name of this process's own: each pytest-xdist worker probes as it collects, at once.
    name = f"pxprobe{os.getpid()}"
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create network namespaces here: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", name], check=True)
    return None


reason = _cannot_make_namespaces()
if reason:
    print(f"skipping the emulated-cluster tests: {reason}")
pytestmark = pytest.mark.skipif(reason is not None, reason=reason or "")


def cluster_script(*args, state=STATE):
    """Runs scripts/emulated_cluster.sh; a failure shows what the script said."""
    env = dict(os.environ, PARALLAX_CLUSTER_DIR=state)
    done = subprocess.run(["bash", CLUSTER_SCRIPT, *args], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, (f"emulated_cluster.sh {' '.join(args)} exited "
                                  f"{done.returncode}:\n{done.stderr}{done.stdout}")


@pytest.fixture(scope="module")
def cluster():
    """The environment a driver needs to reach the hosts."""
    cluster_script("up", str(len(HOSTS)))
    yield {"PARALLAX_SSH_OPTIONS": f"-F {STATE}/ssh_config", "PARALLAX_SSH_CONNECT_TIMEOUT": "3"}
    cluster_script("down")


def start(cluster, *args, **popen):
    """The driver of `python *args`, marked with a token that its processes on every host
    inherit (see `processes`)."""
    token = uuid.uuid4().hex
    # The marker is named like a secret: forwarded to the hosts only because it is listed.
    env = dict(os.environ, PARALLAX_TEST_TOKEN=token,
               PARALLAX_SSH_FORWARD_ENV="PARALLAX_TEST_TOKEN", **cluster)
    env.pop("PARALLAX_ROLE", None)
    options = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    options.update(popen)
    driver = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, **options)
    return driver, token


def processes(token, role=None, host=None):
    """The job's processes (of `role`, on host index `host` = 1, 2, ...), remote_exec and
    the watchdogs aside when a role is asked for."""
    in_host = None if host is None else namespace_pids(host)
    found = []
    for process in psutil.process_iter():
        try:
            environ = process.environ()
            if environ.get("PARALLAX_TEST_TOKEN") != token:
                continue
            if in_host is not None and process.pid not in in_host:
                continue
            command = " ".join(process.cmdline())
            if role is None or (environ.get("PARALLAX_ROLE") == role
                                and "runner.remote_exec" not in command
                                and "runner/watchdog.py" not in command):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def namespace_pids(index):
    out = subprocess.run(["ip", "netns", "pids", f"pxh{index}"], capture_output=True, text=True)
    return {int(pid) for pid in out.stdout.split()}


def host_processes(index, daemons=()):
    """What runs on host `index` besides its sshd listener and `daemons` (slurmd): job
    processes, ssh sessions."""
    left = []
    for pid in namespace_pids(index):
        try:
            process = psutil.Process(pid)
            if process.name() == "sshd" and process.ppid() not in namespace_pids(index):
                continue  # the host's sshd itself (its sessions are its children)
            if process.name() in daemons:
                continue
            left.append(f"{pid} {' '.join(process.cmdline())[:80]}")
        except psutil.NoSuchProcess:
            continue
    return left


def assert_hosts_idle(timeout=10.0, daemons=()):
    """Nothing is left on any host but its sshd listener and `daemons` (sessions must end
    too)."""
    deadline = time.monotonic() + timeout
    while True:
        left = {index: host_processes(index, daemons) for index in range(1, len(HOSTS) + 1)}
        if not any(left.values()):
            return
        assert time.monotonic() < deadline, f"left on the hosts: {left}"
        time.sleep(0.2)


def wait_for(lines_from, text, count):
    seen, lines = 0, []
    for line in lines_from:
        lines.append(line)
        seen += text in line
        if seen == count:
            return
    raise AssertionError(f"never saw {count} lines with {text!r}:\n" + "".join(lines)[-5000:])


def assert_equals_single_device(out, configs, label, workers=4):
    """Every worker's variables, saved by tests/workloads/equivalence.py in `out`, as one
    device trains the sparse model on the combined batch."""
    for config in configs:
        expected, steps = equivalence.train_single_device(
            "sparse", config, workers * equivalence.BATCH_PER_WORKER)
        for worker in range(workers):
            saved = np.load(os.path.join(out, f"{config}.worker{worker}.npz"))
            assert saved["global_steps"].tolist() == steps
            for name, value in expected.items():
                np.testing.assert_allclose(saved[f"var/{name}"], value, rtol=1e-4, atol=1e-5,
                                           err_msg=f"{label} {config} {name} {worker}")
