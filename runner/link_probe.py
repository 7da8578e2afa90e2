"""A short probe of the link between two machines: latency (the median round trip of a small
message, halved) and bandwidth (bytes per second of a bulk transfer, one way).

    python -m runner.link_probe serve              # prints its port, answers one client
    python -m runner.link_probe measure HOST PORT  # prints {"latency": s, "bandwidth": B/s}

`probe(a, b, ssh)` runs the server on machine b and the client on machine a (over ssh where
they are not this machine) and returns what the client measured.
"""
from __future__ import annotations

import json
import shlex
import socket
import statistics
import subprocess
import sys
import time
from typing import Dict

from runner.resources import is_local
from runner.ssh import SSHConfig, environment_line

PINGS, BULK_BYTES, CHUNK = 20, 4 << 20, 64 << 10
TIMEOUT_SECONDS = 60


def serve() -> None:
    with socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True) as server:
        print(server.getsockname()[1], flush=True)
        server.settimeout(TIMEOUT_SECONDS)
        connection, _ = server.accept()
        with connection:
            connection.settimeout(TIMEOUT_SECONDS)
            for _ in range(PINGS):
                connection.sendall(_read(connection, 1))
            received = 0
            while received < BULK_BYTES:
                received += len(connection.recv(CHUNK))
            connection.sendall(b"k")


def measure(host: str, port: int) -> Dict[str, float]:
    with socket.create_connection((host.strip("[]"), port), timeout=TIMEOUT_SECONDS) as link:
        link.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        trips = []
        for _ in range(PINGS):
            started = time.perf_counter()
            link.sendall(b"p")
            _read(link, 1)
            trips.append(time.perf_counter() - started)
        started = time.perf_counter()
        block = b"\0" * CHUNK
        for _ in range(BULK_BYTES // CHUNK):
            link.sendall(block)
        _read(link, 1)
        seconds = time.perf_counter() - started
    return {"latency": statistics.median(trips) / 2, "bandwidth": BULK_BYTES / seconds}


def _read(connection, count: int) -> bytes:
    data = connection.recv(count)
    if not data:
        raise ConnectionError("the other end of the link probe went away")
    return data


def probe(client_host: str, server_host: str, ssh: SSHConfig) -> Dict[str, float]:
    """What the link from `client_host` to `server_host` gives (both names of the resources)."""
    remote = not is_local(server_host)
    server = subprocess.Popen(_command(server_host, ["serve"], ssh), stdout=subprocess.PIPE,
                              stdin=subprocess.PIPE if remote else subprocess.DEVNULL, text=True)
    try:
        if remote:  # runner.remote_exec: its environment, then stdin stays open until the end
            server.stdin.write(environment_line({}).decode())
            server.stdin.flush()
        port = server.stdout.readline().strip()
        if not port.isdigit():
            raise RuntimeError(f"the link probe could not start on {server_host}")
        done = subprocess.run(_command(client_host, ["measure", server_host, port], ssh),
                              capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              timeout=TIMEOUT_SECONDS + ssh.connect_timeout)
        if done.returncode != 0:
            raise RuntimeError(f"the link probe from {client_host} to {server_host} failed: "
                               f"{done.stderr.strip().splitlines()[-1:]}")
        return json.loads(done.stdout)
    finally:
        server.kill()
        server.wait()


def _command(host: str, args, ssh: SSHConfig):
    """The server runs under runner.remote_exec (stopped when its ssh goes); the client ends
    by itself."""
    words = [sys.executable, "-m", "runner.link_probe", *args]
    if is_local(host):
        return words
    if args[0] == "serve":
        return ssh.command(host, words, None)
    return ssh.ssh_argv(host) + [" ".join(shlex.quote(w) for w in words)]


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve()
    elif sys.argv[1:2] == ["measure"] and len(sys.argv) == 4:
        print(json.dumps(measure(sys.argv[2], int(sys.argv[3]))))
    else:
        sys.exit(__doc__)
