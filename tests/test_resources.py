"""Resource specs: Parallax's 'host: ids' lines and Horovod's 'host slots=N', with errors that
name the file, the line and the problem."""
import pytest

from runner import Host, ResourceError, load_resources


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
    ("a slots=0\n", r"line 1: slots must be a positive whole number"),
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
