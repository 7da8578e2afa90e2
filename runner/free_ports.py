"""`python -m runner.free_ports N`: print N TCP ports free on this host, held together while
chosen so none repeats.

The ports come from below the kernel's ephemeral range. A port the kernel hands out itself (a
bind to port 0, the source port of every outgoing connection) is taken from that range, and a
job makes many connections between choosing its ports and its servers binding them (ssh,
rendezvous, Horovod's gloo mesh): a port chosen inside the range can be taken by one of them,
and the server then fails with "Could not start gRPC server".
"""
import random
import socket
import sys
from typing import List, Tuple

LOWEST = 10000  # below it are the ports services are usually configured on
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_range() -> Tuple[int, int]:
    try:
        with open(EPHEMERAL_RANGE) as f:
            low, high = (int(word) for word in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default; other systems choose theirs otherwise


def free_ports(count: int) -> List[int]:
    low, _ = ephemeral_range()
    candidates = list(range(LOWEST, low)) if low - LOWEST >= 16 * count else []
    random.shuffle(candidates)
    sockets = []
    try:
        for port in candidates:
            if len(sockets) == count:
                break
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("", port))
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
        while len(sockets) < count:  # no room below the range: let the kernel choose
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


if __name__ == "__main__":
    print(" ".join(str(port) for port in free_ports(int(sys.argv[1]))))
