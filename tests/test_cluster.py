"""Multi-machine jobs over ssh on an emulated cluster: two hosts, each a network namespace with
its own address, hostname and sshd (scripts/emulated_cluster.sh), two workers a host."""
import os
import signal
import threading
import time

import numpy as np
import pytest

from conftest import WORKLOADS, run_job
from emulated import (HOSTS, RESOURCES, assert_equals_single_device,  # noqa: F401
                      assert_hosts_idle, cluster, namespace_pids, processes, pytestmark, start,
                      wait_for)

pytestmark = [pytestmark, pytest.mark.job]


@pytest.mark.parametrize("run_option", ["AR", "PS", "HYBRID"])
def test_jobs_over_ssh_equal_single_device(cluster, run_option, tmp_path):
    configs = ["sgd", "adam+clip", "adagrad"]
    result = run_job(os.path.join(WORKLOADS, "equivalence.py"), "--model", "sparse",
                     "--resources", RESOURCES, "--run-option", run_option,
                     "--out", str(tmp_path), "--configs", *configs, env=cluster, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"[{HOSTS[1]}:worker:3]" in result.stdout
    assert_equals_single_device(tmp_path, configs, run_option)
    assert_hosts_idle()


@pytest.mark.parametrize("role", ["worker", "server"])
def test_killing_a_remote_process_stops_the_job_everywhere(cluster, role):
    script = os.path.join(WORKLOADS, "supervised.py")
    driver, token = start(cluster, script, "hang", RESOURCES, "", "sparse")
    wait_for(driver.stdout, " ready", 4)
    remote = [p for p in processes(token, role)
              if f"{HOSTS[1]}" in p.environ().get("PARALLAX_CLUSTER", "")
              and p.pid in namespace_pids(2)]
    assert remote, f"no {role} found on the second host"
    remote[0].kill()
    killed = time.monotonic()
    output = driver.communicate(timeout=60)[0]
    assert time.monotonic() - killed < 10
    assert driver.returncode != 0
    assert f"{HOSTS[1]}:{role}:" in output and "was killed by SIGKILL" in output
    deadline = time.monotonic() + 5
    while processes(token) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes(token) == []
    assert_hosts_idle()


@pytest.mark.parametrize("sparse", [True, False], ids=["HYBRID", "AR"])
def test_unreachable_host_is_a_clear_error(cluster, sparse):
    script = os.path.join(WORKLOADS, "supervised.py")
    started = time.monotonic()
    driver, token = start(cluster, script, "ok", f"{HOSTS[0]}:0,1;10.213.0.99:0", "",
                          "sparse" if sparse else "dense")
    output = driver.communicate(timeout=120)[0]
    assert driver.returncode != 0
    # Every mode asks each remote host over ssh before starting anything; the resource line.
    assert "resources string, line 2: cannot reach host 10.213.0.99 over ssh" in output, output
    assert time.monotonic() - started < 60
    assert processes(token) == []
    assert_hosts_idle()


@pytest.mark.parametrize("run_option", ["AR", "PS"])
def test_a_host_name_that_does_not_resolve_is_named_with_its_line(cluster, tmp_path,
                                                                   run_option):
    spec = tmp_path / "cluster"
    spec.write_text(f"{HOSTS[0]}: 0,1\n# a typo:\npxh-typo: 0\n")
    result = run_job(os.path.join(WORKLOADS, "supervised.py"), "ok", str(spec), "",
                     "sparse" if run_option == "PS" else "dense", run_option, env=cluster)
    assert result.returncode != 0
    assert f"{spec}, line 3: cannot reach host pxh-typo over ssh" in result.stderr, result.stderr
    assert "Could not resolve hostname pxh-typo" in result.stderr
    assert_hosts_idle()


def test_malformed_resource_file_names_file_and_line(cluster, tmp_path):
    spec = tmp_path / "cluster"
    spec.write_text(f"{HOSTS[0]}: 0,1\n{HOSTS[1]}: 0,one\n")
    result = run_job(os.path.join(WORKLOADS, "supervised.py"), "ok", str(spec), env=cluster)
    assert result.returncode != 0
    assert f"{spec}, line 2: bad id 'one'" in result.stderr
    assert_hosts_idle()


def _latest_checkpoint_step(ckpt_dir):
    index = (ckpt_dir / "checkpoint").read_text().splitlines()[0]  # model_checkpoint_path: ...
    return int(index.rsplit("-", 1)[1].strip('"'))


def _last_step(output):
    return max(int(line.split()[-1]) for line in output.splitlines()
               if line.startswith(f"[{HOSTS[0]}:worker:0] step "))


TOTAL_STEPS = 24  # of the checkpointed jobs, interrupted or not


@pytest.fixture(scope="module")
def uninterrupted(cluster, tmp_path_factory):
    """The variables of the checkpointed job run through, which the interrupted ones end
    with."""
    out = tmp_path_factory.mktemp("uninterrupted")
    done = run_job(os.path.join(WORKLOADS, "checkpointed.py"), RESOURCES, "HYBRID",
                   str(out / "ckpt"), str(out / "a.npz"), str(TOTAL_STEPS), env=cluster,
                   timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    return np.load(out / "a.npz")


def _assert_same_variables(a, b, exact=False):
    assert sorted(a.files) == sorted(b.files) and "global_step" in a.files
    for name in a.files:
        if exact:
            np.testing.assert_array_equal(b[name], a[name], err_msg=name)
        else:
            np.testing.assert_allclose(b[name], a[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_job_stopped_saves_and_resumes_as_if_never_stopped(cluster, uninterrupted, tmp_path):
    script = os.path.join(WORKLOADS, "checkpointed.py")
    ckpt = tmp_path / "b"
    driver, token = start(cluster, script, RESOURCES, "HYBRID", str(ckpt),
                          str(tmp_path / "b.npz"), str(TOTAL_STEPS), "0.4")
    deadline = time.monotonic() + 240
    while not (ckpt / "model-8.index").exists():
        assert time.monotonic() < deadline and driver.poll() is None, "no checkpoint at step 8"
        time.sleep(0.1)
    time.sleep(0.5)  # between two of the chief's saves (every 4 steps)
    driver.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    output = driver.communicate(timeout=60)[0]
    assert time.monotonic() - stopped < 15
    assert driver.returncode != 0 and not (tmp_path / "b.npz").exists()
    # The chief saved on SIGTERM: no step it finished is lost.
    assert "stopped by SIGTERM after saving a checkpoint" in output, output[-3000:]
    assert _latest_checkpoint_step(ckpt) >= _last_step(output)
    assert processes(token) == []
    assert_hosts_idle()

    resumed = run_job(script, RESOURCES, "HYBRID", str(ckpt), str(tmp_path / "b.npz"),
                      str(TOTAL_STEPS), env=cluster, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    first = [line for line in resumed.stdout.splitlines() if "worker 0 starts at step" in line]
    assert first and int(first[0].split()[-1]) >= 8
    _assert_same_variables(uninterrupted, np.load(tmp_path / "b.npz"))


def test_job_killed_twice_restarts_by_itself_and_ends_as_if_never_killed(cluster, uninterrupted,
                                                                          tmp_path):
    """Config(max_restarts=2): a remote worker killed, then a remote server; each time the
    job starts again from its latest checkpoint, and a save left half-done is cleaned."""
    script = os.path.join(WORKLOADS, "checkpointed.py")
    ckpt = tmp_path / "b"
    driver, token = start(cluster, script, RESOURCES, "HYBRID", str(ckpt),
                          str(tmp_path / "b.npz"), str(TOTAL_STEPS), "0.3", "2")
    lines = []
    threading.Thread(target=lambda: lines.extend(driver.stdout), daemon=True).start()
    for kill_at, role in ((8, "worker"), (16, "server")):
        deadline = time.monotonic() + 300
        while not (ckpt / f"model-{kill_at}.index").exists():
            assert time.monotonic() < deadline and driver.poll() is None, "".join(lines)[-3000:]
            time.sleep(0.1)
        if role == "server":  # what a save killed midway leaves
            (ckpt / "model-17.data-00000-of-00001.tempstate123").write_bytes(b"partial")
        victims = processes(token, role, host=2)
        assert victims, f"no {role} on the second host"
        victims[-1].kill()
    assert driver.wait(timeout=300) == 0, "".join(lines)[-5000:]
    output = "".join(lines)
    assert "restarting the job from the latest checkpoint" in output
    assert "(restart 1 of 2)" in output and "(restart 2 of 2)" in output
    assert f"{HOSTS[1]}:worker:" in output and f"{HOSTS[1]}:server:" in output
    assert not list(ckpt.glob("*.tempstate*"))
    _assert_same_variables(uninterrupted, np.load(tmp_path / "b.npz"), exact=True)
    assert processes(token) == []
    assert_hosts_idle()
