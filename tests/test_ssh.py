"""ssh commands: BatchMode, the user's settings, and quoting that lets no value run a command."""
import json
import shlex
import subprocess
import sys

import pytest

from runner.free_ports import ephemeral_range
from runner.ssh import SSHConfig, environment_line, forwarded_env

pytestmark = pytest.mark.job


def test_remote_command_quotes_every_word(tmp_path):
    marker = tmp_path / "injected"
    hostile = f"x; touch {marker}; $(touch {marker}) `touch {marker}`"
    ssh = SSHConfig(user="alice", port=2222, identity_file="/keys/id", options=["-F", "cfg"])
    argv = ssh.command("node-1", ["/venv/bin/python", "train.py", hostile],
                       cwd=f"/work dir/{hostile}")
    assert argv[:8] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o",
                        "ServerAliveInterval=5", "-o"]
    assert argv[argv.index("-l") + 1] == "alice" and argv[argv.index("-p") + 1] == "2222"
    assert argv[argv.index("-i") + 1] == "/keys/id" and "-F" in argv
    assert argv[-3:-1] == ["--", "node-1"]
    remote = argv[-1]
    # What the remote shell runs: the words come back exactly, nothing executes.
    words = shlex.split(remote)
    assert words[:2] == ["cd", f"/work dir/{hostile}"] and words[2:4] == ["&&", "exec"]
    assert words[-1] == hostile
    subprocess.run(["bash", "-c", "echo " + remote.split(" && ", 1)[1]], check=True,
                   capture_output=True)
    assert not marker.exists()


def test_free_ports_module_prints_distinct_ports_below_the_ephemeral_range():
    """Below the range the kernel takes source ports and port-0 binds from, so none of the
    job's own connections can take a port between its choice and its server's bind."""
    out = subprocess.run([sys.executable, "-m", "runner.free_ports", "5"], capture_output=True,
                         text=True, check=True).stdout.split()
    low, _ = ephemeral_range()
    assert len(set(out)) == 5 and all(1024 <= int(p) < low for p in out)


def test_the_environment_travels_over_the_channel_not_the_command_line(monkeypatch):
    """Values on an ssh command line are readable by any local user (ps); remote_exec takes
    them from the first line of its stdin instead, and only what the job needs is sent."""
    monkeypatch.setenv("TF_TOKEN_hub", "s3cret")
    monkeypatch.setenv("PARALLAX_DB_PASSWORD", "s3cret")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.setenv("UNRELATED", "x")
    env = forwarded_env({"PARALLAX_ROLE": "worker"})
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "2" and env["PARALLAX_ROLE"] == "worker"
    assert "TF_TOKEN_hub" not in env and "PARALLAX_DB_PASSWORD" not in env
    assert "UNRELATED" not in env
    assert forwarded_env({}, also=["TF_TOKEN_hub"])["TF_TOKEN_hub"] == "s3cret"
    argv = SSHConfig().command("node-1", ["train.py"], cwd="/work")
    assert not any("s3cret" in word or "worker" in word for word in argv)
    # The remote side: the child gets the environment sent first; stdin closing stops it.
    remote = subprocess.Popen(
        [sys.executable, "-m", "runner.remote_exec", sys.executable, "-c",
         "import os, json, time; print(json.dumps({k: os.environ.get(k) for k in 'AB'}),"
         " flush=True); time.sleep(60)"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    remote.stdin.write(environment_line({"A": "1 $(x)", "B": "two"}))
    remote.stdin.flush()
    assert json.loads(remote.stdout.readline()) == {"A": "1 $(x)", "B": "two"}
    remote.stdin.close()
    # Stopped, not left sleeping; with status 0, as its driver asked (srun reports others).
    assert remote.wait(timeout=30) == 0
