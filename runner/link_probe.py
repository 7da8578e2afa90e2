"""A short probe of the link between two machines: latency (the median round trip of a small
message, halved) and bandwidth (bytes per second of a bulk transfer, one way); and what each
machine's processes run on: its kernel (machines on one kernel — network namespaces, containers
of one host — share its cores) and the cores they may use.

    python -m runner.link_probe serve HOST CLIENT  # prints its port, then its machine; answers
                                                   # CLIENT once
    python -m runner.link_probe measure HOST PORT  # prints {"latency": s, "bandwidth": B/s,
                                                   #         "machine": {"kernel", "cores"}}

`probe(a, b, ssh)` runs the server on machine b and the client on machine a (over ssh where
they are not this machine) and returns what the client measured, with both machines. The
server listens on b's address of the resources only and answers only a connection from a's
(any of this machine's loopback addresses when a is this machine): whoever else connects is
hung up on.
"""
from __future__ import annotations

import ipaddress
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Dict, Set

from runner.resources import is_local
from runner.ssh import SSHConfig, environment_line

PINGS, BULK_BYTES, CHUNK = 20, 4 << 20, 64 << 10
TIMEOUT_SECONDS = 60


def serve(host: str, client: str) -> None:
    family, _, _, _, address = socket.getaddrinfo(host.strip("[]"), 0,
                                                  type=socket.SOCK_STREAM)[0]
    if ipaddress.ip_address(address[0]).is_loopback and not is_local(client):
        # A host whose own name resolves to loopback here (Debian's 127.0.1.1): every
        # interface, the client's address checked as ever.
        family, address = socket.AF_INET6, ("", 0)
    with socket.create_server(address[:2], family=family,
                              dualstack_ipv6=family == socket.AF_INET6) as server:
        print(server.getsockname()[1], flush=True)
        print(json.dumps(machine()), flush=True)
        server.settimeout(TIMEOUT_SECONDS)
        allowed = _addresses(client)
        while True:
            connection, peer = server.accept()
            if _is_allowed(peer[0], allowed, is_local(client)):
                break
            connection.close()
        with connection:
            connection.settimeout(TIMEOUT_SECONDS)
            for _ in range(PINGS):
                connection.sendall(_read(connection, 1))
            received = 0
            while received < BULK_BYTES:
                received += len(connection.recv(CHUNK))
            connection.sendall(b"k")


def measure(host: str, port: int) -> Dict[str, object]:
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
    return {"latency": statistics.median(trips) / 2, "bandwidth": BULK_BYTES / seconds,
            "machine": machine()}


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def machine() -> Dict[str, object]:
    """This machine as its processes see it: its kernel's boot id (None where there is none
    to read) and the cores this process may run on."""
    try:
        with open(BOOT_ID) as file:
            kernel = file.read().strip()
    except OSError:
        kernel = None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"kernel": kernel, "cores": cores or 1}


def _addresses(host: str) -> Set[str]:
    return {info[4][0] for info in socket.getaddrinfo(host.strip("[]"), 0,
                                                       type=socket.SOCK_STREAM)}


def _is_allowed(peer: str, allowed: Set[str], loopback: bool) -> bool:
    peer = peer.removeprefix("::ffff:")
    return peer in allowed or (loopback and ipaddress.ip_address(peer).is_loopback)


def _read(connection, count: int) -> bytes:
    data = connection.recv(count)
    if not data:
        raise ConnectionError("the other end of the link probe went away")
    return data


def probe(client_host: str, server_host: str, ssh: SSHConfig) -> Dict[str, object]:
    """What the link from `client_host` to `server_host` gives (both names of the resources):
    latency, bandwidth, and machines: [the client's, the server's] (`machine`)."""
    remote = not is_local(server_host)
    server = subprocess.Popen(_command(server_host, ["serve", server_host, client_host], ssh),
                              stdout=subprocess.PIPE,
                              stdin=subprocess.PIPE if remote else subprocess.DEVNULL, text=True)
    try:
        if remote:  # runner.remote_exec: its environment, then stdin stays open until the end
            server.stdin.write(environment_line({}).decode())
            server.stdin.flush()
        port = server.stdout.readline().strip()
        if not port.isdigit():
            raise RuntimeError(f"the link probe could not start on {server_host}")
        served_on = json.loads(server.stdout.readline())
        done = subprocess.run(_command(client_host, ["measure", server_host, port], ssh),
                              capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              timeout=TIMEOUT_SECONDS + ssh.connect_timeout)
        if done.returncode != 0:
            raise RuntimeError(f"the link probe from {client_host} to {server_host} failed: "
                               f"{done.stderr.strip().splitlines()[-1:]}")
        measured = json.loads(done.stdout)
        return dict(measured, machines=[measured.pop("machine"), served_on])
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
    return ssh.oneshot(host, words)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"] and len(sys.argv) == 4:
        serve(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["measure"] and len(sys.argv) == 4:
        print(json.dumps(measure(sys.argv[2], int(sys.argv[3]))))
    else:
        sys.exit(__doc__)
