"""Starting and supervising a job's processes: parsing resources, the Horovod gloo rendezvous,
launching commands and streaming their output, and stopping every one of them.

Like Horovod's `horovod/runner`, this package knows nothing about graphs or TensorFlow: it runs
commands it is given.
"""
from runner.hosts import load_resources
from runner.resources import Host, ResourceError
from runner.process import ProcessSpec, JobFailed, run_processes

# runner.rendezvous (Horovod's) is imported where needed: the processes of a job import this
# package too (runner.remote_exec, runner.heartbeat), and need not load Horovod for it.
__all__ = ["Host", "ResourceError", "load_resources", "ProcessSpec", "JobFailed",
           "run_processes"]
