"""`python -m runner.free_ports N`: print N TCP ports free on this host, held together while
chosen so none repeats."""
import socket
import sys


def free_ports(count: int):
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


if __name__ == "__main__":
    print(" ".join(str(port) for port in free_ports(int(sys.argv[1]))))
