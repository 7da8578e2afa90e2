"""Shared helpers: jobs are started as a user starts them, `python script.py`, in a subprocess."""
import importlib.util
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = os.path.join(REPO, "tests", "workloads")


def run_job(script, *args, timeout=300, cwd=REPO, env=None):
    """Run a Parallax job's driver to completion; its workers are its own business."""
    full_env = dict(os.environ, **(env or {}))
    full_env.pop("PARALLAX_ROLE", None)
    return subprocess.run([sys.executable, script, *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def load_workload(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(WORKLOADS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session", autouse=True)
def graph_mode():
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
