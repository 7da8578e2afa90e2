"""Remote processes through the system `ssh` (so users' ~/.ssh/config applies), never asking
for a password (BatchMode). Every word of the remote command is shell-quoted: no host name,
argument or environment value can inject a command."""
from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import sys
from typing import Dict, List, Optional

# What a remote process inherits from the driver's environment, besides what the job sets.
FORWARDED = ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH")
FORWARDED_PREFIXES = ("PARALLAX_", "TF_", "HOROVOD_", "NCCL_")


@dataclasses.dataclass
class SSHConfig:
    """How to reach remote hosts. Each field can also come from the environment:
    PARALLAX_SSH_USER, PARALLAX_SSH_PORT, PARALLAX_SSH_IDENTITY, PARALLAX_SSH_OPTIONS (extra
    ssh arguments, shell-split, e.g. '-F cluster/ssh_config'), PARALLAX_SSH_CONNECT_TIMEOUT."""

    user: Optional[str] = None
    port: Optional[int] = None
    identity_file: Optional[str] = None
    options: List[str] = dataclasses.field(default_factory=list)
    connect_timeout: int = 10

    @classmethod
    def from_env(cls) -> "SSHConfig":
        env = os.environ
        return cls(user=env.get("PARALLAX_SSH_USER"),
                   port=_env_int(env, "PARALLAX_SSH_PORT", None),
                   identity_file=env.get("PARALLAX_SSH_IDENTITY"),
                   options=shlex.split(env.get("PARALLAX_SSH_OPTIONS", "")),
                   connect_timeout=_env_int(env, "PARALLAX_SSH_CONNECT_TIMEOUT", 10))

    def command(self, host: str, remote_argv: List[str], env: Dict[str, str],
                cwd: Optional[str]) -> List[str]:
        """The local argv that runs `remote_argv` on `host` under runner.remote_exec, which
        stops it when the connection goes away."""
        words = ["env"] + [f"{k}={v}" for k, v in sorted(env.items())]
        words += [sys.executable, "-m", "runner.remote_exec"] + list(remote_argv)
        remote = " ".join(shlex.quote(w) for w in words)
        if cwd:
            remote = f"cd {shlex.quote(cwd)} && exec {remote}"
        return self.ssh_argv(host) + [remote]

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


def forwarded_env(job_env: Dict[str, str]) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k in FORWARDED or k.startswith(FORWARDED_PREFIXES)}
    env.update(job_env)
    return env


class HostUnreachable(RuntimeError):
    pass


def free_ports(host: str, count: int, ssh: SSHConfig) -> List[int]:
    """Ports free on `host` now (asked over ssh, so a host that cannot be reached fails here,
    within the connect timeout, before anything is started)."""
    remote = " ".join(shlex.quote(w) for w in [sys.executable, "-m", "runner.free_ports",
                                                str(count)])
    result = subprocess.run(ssh.ssh_argv(host) + [remote], capture_output=True, text=True,
                            stdin=subprocess.DEVNULL, timeout=ssh.connect_timeout + 30)
    if result.returncode != 0:
        detail = (result.stderr.strip() or result.stdout.strip()).splitlines()
        raise HostUnreachable(f"cannot reach host {host} over ssh (exit {result.returncode}): "
                              f"{detail[-1] if detail else 'no output'}")
    return [int(port) for port in result.stdout.split()]


def _env_int(env, name: str, default):
    text = env.get(name)
    if not text:
        return default
    if not text.isascii() or not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"{name}={text!r}: expected a whole number from 1 to 65535")
    return int(text)
