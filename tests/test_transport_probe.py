"""The transport probe: TensorFlow's gRPC between two machines (two loopback addresses) and
within one; and the collectives probe, of the stack's library: each term measured by real
processes, which end with the probe."""
import psutil
import pytest

from parallax import collectives
from parallax.planning import collectives_probe, transport_probe


@pytest.mark.job
def test_the_probe_measures_every_term_and_leaves_nothing_running():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    between = transport_probe.probe("127.0.0.1", "127.0.0.2", None)
    within = transport_probe.probe("127.0.0.1", None, None)
    for probed in (between, within):
        # a message costs less than a second of wall time (beside other jobs the least local
        # run can take longer than the least message's, and the probe says 0 then), and more
        # than a microsecond of CPU at both ends
        assert 0 <= probed.message_seconds < 1.0
        assert 1e-6 < probed.worker_cpu_message < 1.0 and 1e-6 < probed.server_cpu_message < 1.0
        # a byte's CPU: between 10 TB/s and 10 MB/s at each end
        assert 1e-13 < probed.worker_cpu_byte < 1e-7 and 1e-13 < probed.server_cpu_byte < 1e-7
        assert 0 <= probed.server_cpu_row < 1e-3
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before


@pytest.mark.job
@pytest.mark.collectives
def test_the_collectives_probe_measures_the_librarys_ring_and_leaves_nothing_running():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    probed = collectives_probe.probe(collectives.choose(None), "127.0.0.1", None)
    # a ring's message: more than a microsecond and less than a second, of wall and of CPU;
    # a byte's CPU between 10 TB/s and 10 MB/s; an allgather's at least a message's
    assert 1e-6 < probed.message_seconds < 1.0 and 1e-6 < probed.cpu_message < 1.0
    assert 1e-13 < probed.cpu_byte < 1e-7
    assert probed.cpu_message < probed.cpu_allgather < 1.0
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before
