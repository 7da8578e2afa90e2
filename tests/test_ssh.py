"""ssh commands: BatchMode, the user's settings, and quoting that lets no value run a command."""
import shlex
import subprocess
import sys

from runner.ssh import SSHConfig


def test_remote_command_quotes_every_word(tmp_path):
    marker = tmp_path / "injected"
    hostile = f"x; touch {marker}; $(touch {marker}) `touch {marker}`"
    ssh = SSHConfig(user="alice", port=2222, identity_file="/keys/id", options=["-F", "cfg"])
    argv = ssh.command("node-1", ["/venv/bin/python", "train.py", hostile],
                       {"PARALLAX_X": hostile}, cwd=f"/work dir/{hostile}")
    assert argv[:8] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o",
                        "ServerAliveInterval=5", "-o"]
    assert argv[argv.index("-l") + 1] == "alice" and argv[argv.index("-p") + 1] == "2222"
    assert argv[argv.index("-i") + 1] == "/keys/id" and "-F" in argv
    assert argv[-3:-1] == ["--", "node-1"]
    remote = argv[-1]
    # What the remote shell runs: the words come back exactly, nothing executes.
    words = shlex.split(remote)
    assert words[:2] == ["cd", f"/work dir/{hostile}"] and words[2:4] == ["&&", "exec"]
    assert f"PARALLAX_X={hostile}" in words and words[-1] == hostile
    subprocess.run(["bash", "-c", "echo " + remote.split(" && ", 1)[1]], check=True,
                   capture_output=True)
    assert not marker.exists()


def test_free_ports_module_prints_distinct_ports():
    out = subprocess.run([sys.executable, "-m", "runner.free_ports", "5"], capture_output=True,
                         text=True, check=True).stdout.split()
    assert len(set(out)) == 5 and all(1024 <= int(p) < 65536 for p in out)
