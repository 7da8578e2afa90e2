"""Multi-machine jobs over ssh on an emulated cluster: two hosts, each a network namespace with
its own address, hostname and sshd (scripts/emulated_cluster.sh), two workers a host."""
import os
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import psutil
import pytest

from conftest import REPO, WORKLOADS, load_workload, run_job

equivalence = load_workload("equivalence")
CLUSTER_SCRIPT = os.path.join(REPO, "scripts", "emulated_cluster.sh")
STATE = "/tmp/parallax-test-cluster"
HOSTS = ["10.213.0.2", "10.213.0.3"]
RESOURCES = ";".join(f"{host}:0,1" for host in HOSTS)


def _cannot_make_namespaces():
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    probe = subprocess.run(["ip", "netns", "add", "pxprobe"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create network namespaces here: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", "pxprobe"], check=True)
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
    cluster_script("up", str(len(HOSTS)))
    yield {"PARALLAX_SSH_OPTIONS": f"-F {STATE}/ssh_config", "PARALLAX_SSH_CONNECT_TIMEOUT": "3"}
    cluster_script("down")


@pytest.mark.parametrize("run_option", ["AR", "PS", "HYBRID"])
def test_jobs_over_ssh_equal_single_device(cluster, run_option, tmp_path):
    configs = ["sgd", "adam+clip", "adagrad"]
    result = run_job(os.path.join(WORKLOADS, "equivalence.py"), "--model", "sparse",
                     "--resources", RESOURCES, "--run-option", run_option,
                     "--out", str(tmp_path), "--configs", *configs, env=cluster, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"[{HOSTS[1]}:worker:3]" in result.stdout
    for config in configs:
        expected, steps = equivalence.train_single_device(
            "sparse", config, 4 * equivalence.BATCH_PER_WORKER)
        for worker in range(4):
            saved = np.load(tmp_path / f"{config}.worker{worker}.npz")
            assert saved["global_steps"].tolist() == steps
            for name, value in expected.items():
                np.testing.assert_allclose(saved[f"var/{name}"], value, rtol=1e-4, atol=1e-5,
                                           err_msg=f"{run_option} {config} {name} {worker}")
    _assert_hosts_idle()


def _start(cluster, *args):
    token = uuid.uuid4().hex
    # The marker is named like a secret: forwarded to the hosts only because it is listed.
    env = dict(os.environ, PARALLAX_TEST_TOKEN=token,
               PARALLAX_SSH_FORWARD_ENV="PARALLAX_TEST_TOKEN", **cluster)
    env.pop("PARALLAX_ROLE", None)
    driver = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return driver, token


def _processes(token, role=None):
    found = []
    for process in psutil.process_iter():
        try:
            environ = process.environ()
            if environ.get("PARALLAX_TEST_TOKEN") != token:
                continue
            if role is None or (environ.get("PARALLAX_ROLE") == role
                                and "runner.remote_exec" not in " ".join(process.cmdline())):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _assert_hosts_idle():
    """Nothing but each host's sshd is left in the hosts' namespaces."""
    for index in range(1, len(HOSTS) + 1):
        pids = subprocess.run(["ip", "netns", "pids", f"pxh{index}"], capture_output=True,
                              text=True).stdout.split()
        names = [psutil.Process(int(pid)).name() for pid in pids if psutil.pid_exists(int(pid))]
        assert set(names) <= {"sshd"}, f"left on host {index}: {names}"


def _wait_for(lines_from, text, count):
    seen = 0
    for line in lines_from:
        seen += text in line
        if seen == count:
            return
    raise AssertionError(f"never saw {count} lines with {text!r}")


@pytest.mark.parametrize("role", ["worker", "server"])
def test_killing_a_remote_process_stops_the_job_everywhere(cluster, role):
    script = os.path.join(WORKLOADS, "supervised.py")
    driver, token = _start(cluster, script, "hang", RESOURCES, "", "sparse")
    _wait_for(driver.stdout, " ready", 4)
    remote = [p for p in _processes(token, role)
              if f"{HOSTS[1]}" in p.environ().get("PARALLAX_CLUSTER", "")
              and p.pid in _namespace_pids(2)]
    assert remote, f"no {role} found on the second host"
    remote[0].kill()
    killed = time.monotonic()
    output = driver.communicate(timeout=60)[0]
    assert time.monotonic() - killed < 10
    assert driver.returncode != 0
    assert f"{HOSTS[1]}:{role}:" in output and "was killed by SIGKILL" in output
    deadline = time.monotonic() + 5
    while _processes(token) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes(token) == []
    _assert_hosts_idle()


def _namespace_pids(index):
    out = subprocess.run(["ip", "netns", "pids", f"pxh{index}"], capture_output=True, text=True)
    return {int(pid) for pid in out.stdout.split()}


@pytest.mark.parametrize("sparse", [True, False], ids=["HYBRID", "AR"])
def test_unreachable_host_is_a_clear_error(cluster, sparse):
    script = os.path.join(WORKLOADS, "supervised.py")
    started = time.monotonic()
    driver, token = _start(cluster, script, "ok", f"{HOSTS[0]}:0,1;10.213.0.99:0", "",
                           "sparse" if sparse else "dense")
    output = driver.communicate(timeout=120)[0]
    assert driver.returncode != 0
    assert "10.213.0.99" in output
    assert ("cannot reach host 10.213.0.99 over ssh" in output if sparse
            else "ssh could not reach or lost 10.213.0.99" in output)
    assert time.monotonic() - started < 60
    assert _processes(token) == []
    _assert_hosts_idle()


def test_malformed_resource_file_names_file_and_line(cluster, tmp_path):
    spec = tmp_path / "cluster"
    spec.write_text(f"{HOSTS[0]}: 0,1\n{HOSTS[1]}: 0,one\n")
    result = run_job(os.path.join(WORKLOADS, "supervised.py"), "ok", str(spec), env=cluster)
    assert result.returncode != 0
    assert f"{spec}, line 2: bad id 'one'" in result.stderr
    _assert_hosts_idle()


def test_job_resumes_from_checkpoint_as_if_never_stopped(cluster, tmp_path):
    script = os.path.join(WORKLOADS, "checkpointed.py")
    total = 16
    uninterrupted = run_job(script, RESOURCES, "HYBRID", str(tmp_path / "a"),
                            str(tmp_path / "a.npz"), str(total), env=cluster, timeout=300)
    assert uninterrupted.returncode == 0, uninterrupted.stdout[-3000:]

    ckpt = tmp_path / "b"
    driver, token = _start(cluster, script, RESOURCES, "HYBRID", str(ckpt),
                           str(tmp_path / "b.npz"), str(total), "0.4")
    deadline = time.monotonic() + 240
    while not (ckpt / "model-8.index").exists():
        assert time.monotonic() < deadline and driver.poll() is None, "no checkpoint at step 8"
        time.sleep(0.1)
    driver.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    driver.communicate(timeout=60)
    assert time.monotonic() - stopped < 10
    assert driver.returncode != 0 and not (tmp_path / "b.npz").exists()
    assert _processes(token) == []
    _assert_hosts_idle()

    resumed = run_job(script, RESOURCES, "HYBRID", str(ckpt), str(tmp_path / "b.npz"),
                      str(total), env=cluster, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    start = [line for line in resumed.stdout.splitlines() if "worker 0 starts at step" in line]
    assert start and int(start[0].split()[-1]) >= 8
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    assert sorted(a.files) == sorted(b.files) and "global_step" in a.files
    for name in a.files:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-5, atol=1e-6, err_msg=name)
