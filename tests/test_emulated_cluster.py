"""The emulated cluster itself: taken down and brought up again at once, as one test module's
fixture does right after another's (a namespace's veth end used to outlive its 'down')."""
import subprocess

from emulated import cluster_script, pytestmark  # noqa: F401
STATE = "/tmp/parallax-test-cycle"


def _cluster_links():
    shown = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    names = [line.split(": ")[1].split("@")[0] for line in shown.splitlines()]
    return [name for name in names if name.startswith(("pxv", "pxe", "pxbr"))]


def test_down_then_up_at_once_works_every_time():
    try:
        for shape in ([], ["--rate", "1gbit"], []):
            cluster_script("up", "3", *shape, state=STATE)
            for address in ("10.213.0.2", "10.213.0.4"):
                reached = subprocess.run(
                    ["ssh", "-F", f"{STATE}/ssh_config", "-o", "BatchMode=yes", address,
                     "hostname"], capture_output=True, text=True, timeout=30)
                assert reached.returncode == 0, reached.stderr
            cluster_script("down", state=STATE)
            assert _cluster_links() == [], "down returned with links still there"
            assert not subprocess.run(["ip", "netns", "list"], capture_output=True,
                                      text=True).stdout.strip()
    finally:
        cluster_script("down", state=STATE)
