"""Remote processes through the system `ssh` (so users' ~/.ssh/config applies), never asking
for a password (BatchMode). Every word of the remote command is shell-quoted: no host name or
argument can inject a command. The environment travels over the ssh channel, never on a
command line (where any local user could read it with `ps`), and only what the job needs."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

# What a remote process inherits from the driver's environment, besides what the job sets:
# where its interpreter and libraries are, and the settings of Parallax, TF, Horovod and NCCL,
# but no variable named like a secret unless the user lists it (SSHConfig.forward_env).
FORWARDED = ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH")
FORWARDED_PREFIXES = ("PARALLAX_", "TF_", "HOROVOD_", "NCCL_")
_SECRET = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|API_?KEY|PRIVATE", re.IGNORECASE)


@dataclasses.dataclass
class SSHConfig:
    """How to reach remote hosts. Each field can also come from the environment:
    PARALLAX_SSH_USER, PARALLAX_SSH_PORT, PARALLAX_SSH_IDENTITY, PARALLAX_SSH_OPTIONS (extra
    ssh arguments, shell-split, e.g. '-F cluster/ssh_config'), PARALLAX_SSH_CONNECT_TIMEOUT,
    PARALLAX_SSH_FORWARD_ENV (comma-separated names of more variables to forward)."""

    user: Optional[str] = None
    port: Optional[int] = None
    identity_file: Optional[str] = None
    options: List[str] = dataclasses.field(default_factory=list)
    connect_timeout: int = 10
    forward_env: List[str] = dataclasses.field(default_factory=list)  # more names to forward

    @classmethod
    def from_env(cls) -> "SSHConfig":
        env = os.environ
        return cls(user=env.get("PARALLAX_SSH_USER"),
                   port=_env_int(env, "PARALLAX_SSH_PORT", None),
                   identity_file=env.get("PARALLAX_SSH_IDENTITY"),
                   options=shlex.split(env.get("PARALLAX_SSH_OPTIONS", "")),
                   connect_timeout=_env_int(env, "PARALLAX_SSH_CONNECT_TIMEOUT", 10),
                   forward_env=[n for n in env.get("PARALLAX_SSH_FORWARD_ENV", "").split(",")
                                if n.strip()])

    def command(self, host: str, remote_argv: List[str], cwd: Optional[str]) -> List[str]:
        """The local argv that runs `remote_argv` on `host` under runner.remote_exec, which
        takes its environment from the first line sent to it (`environment_line`) and stops
        it when the connection goes away."""
        words = [sys.executable, "-m", "runner.remote_exec"] + list(remote_argv)
        remote = " ".join(shlex.quote(w) for w in words)
        if cwd:
            remote = f"cd {shlex.quote(cwd)} && exec {remote}"
        return self.ssh_argv(host) + [remote]

    def oneshot(self, host: str, argv: List[str]) -> List[str]:
        """A short command on `host`, every word quoted (free ports, the link probe's
        client)."""
        return self.ssh_argv(host) + [" ".join(shlex.quote(w) for w in argv)]

    def ssh_argv(self, host: str) -> List[str]:
        argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout}",
                "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=2"]
        if self.user:
            argv += ["-l", self.user]
        if self.port:
            argv += ["-p", str(self.port)]
        if self.identity_file:
            argv += ["-i", self.identity_file]
        return argv + list(self.options) + ["--", host.strip("[]")]  # IPv6 without brackets


def forwarded_env(job_env: Dict[str, str], also: Sequence[str] = ()) -> Dict[str, str]:
    """The driver's variables a remote process gets (see FORWARDED), then the job's own."""
    env = {k: v for k, v in os.environ.items() if k in also or k in FORWARDED or (
        k.startswith(FORWARDED_PREFIXES) and not _SECRET.search(k))}
    env.update(job_env)
    return env


def environment_line(env: Dict[str, str]) -> bytes:
    """What remote_exec reads first from its stdin: the environment, as one JSON line."""
    return json.dumps(env).encode() + b"\n"


class HostUnreachable(RuntimeError):
    pass


def free_ports(host: str, count: int, ssh) -> List[int]:
    """Ports free on `host` now (asked there, over ssh or as a Slurm step: `ssh` is an
    SSHConfig or a runner.slurm.SrunConfig), so a host that cannot be reached fails here,
    within the connect timeout, before anything is started."""
    result = subprocess.run(
        ssh.oneshot(host, [sys.executable, "-m", "runner.free_ports", str(count)]),
        capture_output=True, text=True, stdin=subprocess.DEVNULL,
        timeout=ssh.connect_timeout + 30)
    if result.returncode != 0:
        detail = (result.stderr.strip() or result.stdout.strip()).splitlines()
        how = "over ssh" if isinstance(ssh, SSHConfig) else "with srun"
        raise HostUnreachable(f"cannot reach host {host} {how} (exit {result.returncode}): "
                              f"{detail[-1] if detail else 'no output'}")
    return [int(port) for port in result.stdout.split()]


def _env_int(env, name: str, default):
    text = env.get(name)
    if not text:
        return default
    if not text.isascii() or not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"{name}={text!r}: expected a whole number from 1 to 65535")
    return int(text)
