"""Starting and supervising a job's processes: parsing resources, the Horovod gloo rendezvous,
launching commands and streaming their output, and stopping every one of them.

Like Horovod's `horovod/runner`, this package knows nothing about graphs or TensorFlow: it runs
commands it is given.
"""
from runner.resources import Host, ResourceError, load_resources
from runner.process import ProcessSpec, JobFailed, run_processes
from runner.rendezvous import GlooRendezvous

__all__ = ["Host", "ResourceError", "load_resources", "ProcessSpec", "JobFailed",
           "run_processes", "GlooRendezvous"]
