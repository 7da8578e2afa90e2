"""Shared helpers: jobs are started as a user starts them, `python script.py`, in a subprocess."""
import importlib
import importlib.util
import os
import subprocess
import sys

# Imported now, not first in a test: numpy.testing runs `lscpu` when imported (its SVE
# check), which no_processes_outside_job_tests would take for the test starting a process.
import numpy.testing  # noqa: F401
import pytest
from xdist.scheduler import LoadScopeScheduling

import equivalence_jobs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = os.path.join(REPO, "tests", "workloads")
# Horovod builds against TensorFlow 2.18 and older: its own tests run on that stack
# (PARALLAX_STACK=horovod scripts/test.sh, .ci/run's second part).
HOROVOD = importlib.util.find_spec("horovod") is not None
# The op types of the collectives a graph rewritten here holds (the stack's default library).
# beside_servers: what a step's trace shows of its allreduce where the job has servers
# (TensorFlow's collectives then run apart from the steps, the step waiting on a queue).
COLLECTIVE_OPS = ({"allreduce": "HorovodAllreduce", "allgather": "HorovodAllgather",
                   "prefix": "Horovod", "beside_servers": "HorovodAllreduce"} if HOROVOD else
                  {"allreduce": "CollectiveReduceV2", "allgather": "CollectiveGatherV2",
                   "prefix": "Collective", "beside_servers": "parallax_apart_"})
needs_horovod = pytest.mark.skipif(not HOROVOD, reason="needs Horovod, not installed here: "
                                   "it runs on the Horovod stack (PARALLAX_STACK=horovod)")


def run_job(script, *args, timeout=300, cwd=REPO, env=None):
    """Run a Parallax job's driver to completion; its workers are its own business."""
    full_env = dict(os.environ, **(env or {}))
    full_env.pop("PARALLAX_ROLE", None)
    return subprocess.run([sys.executable, script, *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def load_workload(name):
    if WORKLOADS not in sys.path:  # as the workload sees its folder when run as a script
        sys.path.insert(0, WORKLOADS)
    spec = importlib.util.spec_from_file_location(name, os.path.join(WORKLOADS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The modules whose tests use the network namespaces of scripts/emulated_cluster.sh (tests/
# emulated.py's hosts, or benchmarks/run.py's), which one test at a time can hold.
EMULATED_CLUSTER_MODULES = {f"tests/test_{name}.py" for name in (
    "benchmarks", "cluster", "emulated_cluster", "faults", "slurm")}


# The units of work that take longest (2026-12-07, on 2 cores), about longest first: handed out
# first, so that the shorter ones fill the end of both workers' time. The others follow,
# those of most tests first (xdist's order).
LONGEST_FIRST = [
    "tests/test_user_graphs.py", "tests/test_checkpoints.py", "tests/test_launch.py",
    "tests/test_equivalence.py::two-machines", "tests/test_examples.py",
    "tests/test_control.py", "tests/test_verify.py", "tests/test_plan_cli.py",
    "tests/test_equivalence.py::one-machine",
    "tests/test_equivalence.py::test_auto_chooses_by_measured_rows_and_equals_single_device",
    "tests/test_equivalence.py::HYBRID-split", "tests/test_equivalence.py::HYBRID-keras-"
    "embedding-split", "tests/test_equivalence.py::AUTO-two-tables",
    "tests/test_equivalence.py::test_searched_partitions_are_chosen_by_the_cost_model_and_"
    "equal_single_device", "tests/test_equivalence.py::AUTO-seq2seq",
]


class _ModuleScheduling(LoadScopeScheduling):
    """pytest-xdist's scheduling for scripts/test.sh's two workers: a module's tests on one
    worker, so that a job a module fixture runs for all its tests runs once (test_equivalence's
    tests by job: its fixture runs each job once, for the tests of that job); the emulated
    cluster's modules on one worker, one test after another, and first: they are the longest
    chain of tests. Then LONGEST_FIRST, then the others."""
    EMULATED = "emulated cluster"
    _ordered = False

    def _split_scope(self, nodeid):
        module = nodeid.split("::")[0]
        if module in EMULATED_CLUSTER_MODULES:
            return self.EMULATED
        if module == "tests/test_equivalence.py":
            job = equivalence_jobs.job_of_test(nodeid)
            # a test without a job: a unit of its own, each of its parameters
            return f"{module}::{job}" if job else nodeid
        return module

    def _assign_work_unit(self, node):
        if not self._ordered:
            self._ordered = True
            first = [self.EMULATED, *LONGEST_FIRST]
            rank = {scope: index for index, scope in enumerate(first)}
            def key(scope):  # a test's parameters take its rank
                return rank.get(scope, rank.get(scope.split("[")[0], len(first)))
            for scope in sorted(self.workqueue, key=key):
                self.workqueue.move_to_end(scope)  # a stable sort: the others keep their order
        super()._assign_work_unit(node)


def pytest_xdist_make_scheduler(config, log):
    return _ModuleScheduling(config, log)


@pytest.fixture(scope="session", autouse=True)
def graph_mode():
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()




class ProcessStartedOutsideAJob(AssertionError):
    """Raised where a test not marked job starts a process (an AssertionError, which code under
    test that catches OSError or RuntimeError around its launches lets through)."""


_PROCESS_STARTERS = [  # (module, attribute): the ways this interpreter starts a process
    ("subprocess", "Popen.__init__"),  # subprocess.run and check_output, os.popen, asyncio
    ("_posixsubprocess", "fork_exec"),  # multiprocessing's spawn and forkserver
    ("os", "fork"), ("os", "forkpty"), ("os", "posix_spawn"), ("os", "posix_spawnp"),
    ("os", "system"),  # os.spawn* and pty.fork go through os.fork and os.forkpty
    ("multiprocessing.process", "BaseProcess.start"),  # Pool, ProcessPoolExecutor
]
_NO_PROCESS_MESSAGE = "this test starts a process: mark it @pytest.mark.job"
_ATTEMPTS = pytest.StashKey[list]()


@pytest.fixture(autouse=True)
def no_processes_outside_job_tests(request):
    """The fast tier (-m "not job") runs in this process alone: a test not marked job that
    starts a process fails, also where the code under test swallows the error (see
    pytest_runtest_makereport). A module or session fixture is set up before this one: what it
    starts is not caught."""
    if request.node.get_closest_marker("job") is not None:
        yield
        return
    attempts = request.node.stash.setdefault(_ATTEMPTS, [])

    def refuse(what):
        def starter(*args, **kwargs):
            attempts.append(what)
            raise ProcessStartedOutsideAJob(
                f"{_NO_PROCESS_MESSAGE} ({what} in {request.node.nodeid})")
        return starter

    with pytest.MonkeyPatch.context() as patch:
        for module_name, attribute in _PROCESS_STARTERS:
            owner = importlib.import_module(module_name)
            *path, name = attribute.split(".")
            for part in path:
                owner = getattr(owner, part)
            if hasattr(owner, name):
                patch.setattr(owner, name, refuse(f"{module_name}.{attribute}"))
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A phase that tried to start a process and passed (the error was caught) fails."""
    outcome = yield
    report = outcome.get_result()
    attempts = item.stash.get(_ATTEMPTS, [])
    if attempts and report.passed:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid}: {_NO_PROCESS_MESSAGE}: it called "
                           f"{', '.join(sorted(set(attempts)))} and caught the error")
    attempts.clear()
