"""Resource specs: Parallax's 'host: ids' lines and Horovod's 'host slots=N', with errors that
name the file, the line and the problem."""
import random
import time

import pytest

from runner import Host, ResourceError, load_resources
from runner.resources import MAX_SLOTS, is_local


def test_inline_and_file_forms(tmp_path):
    assert load_resources("localhost:0,1") == [Host("localhost", (0, 1))]
    assert load_resources("127.0.0.1:0;127.0.0.2: 0, 1") == [
        Host("127.0.0.1", (0,)), Host("127.0.0.2", (0, 1))]
    spec = tmp_path / "cluster"
    spec.write_text("# two machines\n\n10.0.0.1: 0,2   # GPUs 0 and 2\nnode-b slots=3\n")
    assert load_resources(str(spec)) == [Host("10.0.0.1", (0, 2)), Host("node-b", (0, 1, 2))]


def test_host_without_ids_is_one_cpu_worker_without_gpus():
    assert load_resources("localhost") == [Host("localhost", (0,))]


@pytest.mark.parametrize("text, message", [
    ("a: 0,x\n", r"line 1: bad id 'x'"),
    ("a: 0\n\na: 1\n", r"line 3: duplicate host 'a' \(first on line 1\)"),
    ("a: 0,0\n", r"line 1: id 0 is listed twice"),
    ("a:\n", r"line 1: no ids after ':'"),
    ("a slots=0\n", r"line 1: slots must be a whole number from 1 to 4096"),
    ("bad host name\n", r"line 1: 'bad host name' is not a host name"),
    ("# only a comment\n\n", r"no hosts"),
])
def test_errors_name_file_and_line(tmp_path, text, message):
    spec = tmp_path / "cluster"
    spec.write_text(text)
    with pytest.raises(ResourceError, match=message) as error:
        load_resources(str(spec))
    assert str(spec) in str(error.value)


def test_missing_file_and_empty_spec():
    with pytest.raises(ResourceError, match="resource file /no/such/file does not exist"):
        load_resources("/no/such/file")
    with pytest.raises(ResourceError, match="resources must be"):
        load_resources("")


def test_shipped_cluster_specs_parse():
    import os
    from conftest import REPO
    folder = os.path.join(REPO, "cluster_specs")
    for name in os.listdir(folder):
        assert load_resources(os.path.join(folder, name)), name


def test_host_names_cannot_pass_for_ssh_options():
    with pytest.raises(ResourceError, match="is not a host name"):
        load_resources("-oProxyCommand=evil: 0")


@pytest.mark.parametrize("text, message", [
    ("h: ²", "bad id '²'"),                         # not an ASCII digit
    ("h: ٣", "bad id"),
    ("h slots=10000000000", "slots must be a whole number from 1 to 4096"),
    ("h: " + "9" * 4300, "bad id"),
    ("h: " + ",".join(map(str, range(40000))), "40000 ids, more than 4096"),
    ("[::1]:0;[::1]", "duplicate host"),
    ("[zz::1]: 0", "is not a host name or address"),
    ("localhost:0;1", "'1' .*';' separates hosts|bad id"),
])
def test_what_is_not_documented_is_refused(text, message):
    with pytest.raises(ResourceError, match=message):
        load_resources(text)


def test_only_newlines_and_semicolons_separate_hosts(tmp_path):
    spec = tmp_path / "cluster"
    spec.write_text("a: 0  # x\x0cb: 1 and\u2028c: 2\nd: 0\r\n", encoding="utf-8")
    assert [h.name for h in load_resources(str(spec))] == ["a", "d"]


def test_ipv6_in_brackets_and_which_hosts_are_local():
    assert load_resources("[::1]: 0,1;[fe80::2] slots=2") == [
        Host("[::1]", (0, 1)), Host("[fe80::2]", (0, 1))]
    assert Host("[fe80::2]", (0,)).address == "fe80::2"
    assert is_local("127.0.0.2") and is_local("[::1]") and is_local("localhost")
    assert not is_local("127.evil") and not is_local("127.0.0.1.example.com")


def test_a_file_that_is_not_utf8_names_its_line(tmp_path):
    spec = tmp_path / "cluster"
    spec.write_bytes(b"a: 0\nb\xff: 1\n")
    with pytest.raises(ResourceError, match=r"cluster, line 2: not UTF-8"):
        load_resources(str(spec))


_PIECES = ["a", "h-1", "127.", "0", "1", "4095", "4096", "99999999999", "²", "٣", "０", ":", ",",
           ";", "\n", "\r", "\t", " ", "#", "[", "]", "::1", "=", "slots", "slots=", "-o",
           "$(id)", "`id`", "..", "\x0c", "\u2028", "\x00", "é", "💥", "\\", "/"]


def _fuzzed(rng, index):
    kind = index % 4
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
    if kind == 1:
        return "".join(rng.choice(_PIECES) for _ in range(rng.randrange(1, 24)))
    if kind == 2:
        return f"h{rng.randrange(3)}" + rng.choice([": ", " slots=", ":", ": 0,"]) + (
            rng.choice("0123456789²") * rng.randrange(1, 6000))
    return "".join(chr(rng.randrange(1, 0x3000)) for _ in range(rng.randrange(1, 40)))


def test_fuzzed_specs_parse_or_fail_with_a_resource_error(tmp_path):
    """Random bytes, unicode, huge numbers, separators, hostile names: a spec either parses
    into hosts the grammar allows, or fails with a ResourceError; nothing else escapes."""
    rng = random.Random(20261123)
    slowest, parsed = 0.0, 0
    for index in range(6000):
        spec = _fuzzed(rng, index)
        if isinstance(spec, bytes):
            path = tmp_path / "fuzzed"
            path.write_bytes(spec)
            spec = str(path)
        started = time.perf_counter()
        try:
            hosts = load_resources(spec)
        except ResourceError:
            continue
        finally:
            slowest = max(slowest, time.perf_counter() - started)
        parsed += 1
        for host in hosts:
            assert host.name.isascii() and not host.name.startswith("-"), host
            assert 0 < len(host.slots) <= MAX_SLOTS and max(host.slots) < MAX_SLOTS, host
    print(f"fuzzed resource specs: {parsed} of 6000 parsed; slowest {slowest * 1000:.1f} ms")
