"""Launching the job the driver planned: one worker process per slot re-running the user's
command (and, for the PS path, one parameter server per machine), on this machine, over ssh,
or as Slurm job steps, supervised until the job ends; the driver leaves with the job's exit
status.

Each process learns its role, the cluster and the plan from its environment (contracts.py);
`runner` does the process work. Remote hosts are assumed to have the same paths (script,
interpreter, virtualenv).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import subprocess
import sys
import time
import uuid
from typing import Dict, List, NoReturn, Optional, Tuple, Union

from parallax import contracts
from parallax.cluster import Cluster
from parallax.config import RuntimeOptions
from parallax.errors import ParallaxError
from parallax.planning.cost import Collective, Transport
from parallax.runtime import input_check, input_position
from runner import JobFailed, ProcessSpec, link_probe, load_resources, run_processes
from runner.control_server import ControlServer
from runner.free_ports import free_ports
from runner.process import GRACE_SECONDS
from runner.progress import ProgressDisplay
from runner.resources import Host, is_local
from runner.settings import Settings
from runner import slurm
from runner.slurm import SrunConfig
from runner.ssh import HostUnreachable, SSHConfig
from runner.ssh import free_ports as remote_free_ports

log = logging.getLogger("parallax")
DRIVER_PREFIX = "[driver] "


def workers_per_machine(resources: str) -> List[int]:
    return [len(host.slots) for host in load_resources(resources)]


def probe_links(resources: str, settings: Settings) -> Tuple[Optional[dict], Optional[dict]]:
    """What the link between the first two machines and the one within the first machine give
    ({latency, bandwidth, machines}: runner.link_probe.probe; None between machines with one
    machine, or for a probe that fails, which is logged)."""
    hosts = load_resources(resources)
    shell = _remote_shell(resources, settings)

    def probe(client: str, server: str) -> Optional[dict]:
        try:
            return link_probe.probe(client, server, shell)
        except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as error:
            log.warning("the link probe between %s and %s failed (%s)", client, server, error)
            return None

    first = hosts[0].name
    between = probe(first, hosts[1].name) if len(hosts) > 1 else None
    return between, probe(first, first)


def probe_transport(resources: str, settings: Settings) -> Optional[Transport]:
    """What TensorFlow's transport costs within the first machine and between the first two
    (planning/transport_probe.py); None for a probe that fails, which is logged."""
    # Imported here: `python -m` runs the probe, which the package must not have imported.
    from parallax.planning import transport_probe  # pylint: disable=import-outside-toplevel
    hosts = load_resources(resources)
    second = hosts[1].name if len(hosts) > 1 else None
    try:
        return transport_probe.probe(hosts[0].name, second, _remote_shell(resources, settings))
    except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as error:
        log.warning("the transport probe on %s failed (%s)", resources, error)
        return None


def probe_collectives(resources: str, settings: Settings, library: str
                      ) -> Optional[Collective]:
    """What the job's collectives `library` costs between two ranks on the first machine
    (planning/collectives_probe.py); None for a probe that fails, which is logged."""
    from parallax.planning import collectives_probe  # pylint: disable=C0415  (as above)
    first = load_resources(resources)[0].name
    try:
        return collectives_probe.probe(library, first, _remote_shell(resources, settings))
    except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as error:
        log.warning("the collectives probe on %s failed (%s)", first, error)
        return None


Shell = Union[SSHConfig, SrunConfig]  # how processes start on other hosts


def _remote_shell(resources: str, settings: Settings) -> Shell:
    """How processes start on other hosts: as Slurm job steps in an allocation's resources,
    else over ssh."""
    if slurm.names_allocation(resources):
        return SrunConfig.from_env()
    try:
        return settings.ssh or SSHConfig.from_env()
    except ValueError as error:  # a PARALLAX_SSH_* variable that is not a number
        raise ParallaxError(str(error)) from None


def run_driver(resources: str, settings: Settings, runtime: RuntimeOptions, with_servers: bool,
               collectives: str, job_env: Dict[str, str]) -> NoReturn:
    """Run the job (again, up to settings.max_restarts times, when it fails) and exit with its
    status. `collectives` is the library the workers use (parallax/collectives/: Horovod's
    needs its rendezvous, TensorFlow's a server on each worker). `job_env` (the plan) goes to
    every process of the job; of the `runtime` options
    the driver reads where checkpoints go (the chief, which saves, is stopped first) and
    whether to warn of unsharded input."""
    hosts = load_resources(resources)
    remote = [h for h in hosts if not is_local(h.name)]
    if remote and len(remote) < len(hosts):
        raise ParallaxError(
            f"{resources}: loopback hosts cannot be mixed with remote hosts "
            f"{[h.name for h in remote]}: the remote "
            "ones could not reach them; name this machine by an address they can reach")
    shell = _remote_shell(resources, settings)
    # Where the job's processes reach this machine (the rendezvous, the control plane).
    address = _address_towards(remote[0]) if remote else "127.0.0.1"
    num_workers = sum(len(host.slots) for host in hosts)
    for attempt in range(settings.max_restarts + 1):
        try:
            _run_job(hosts, address, settings, runtime, shell, with_servers, collectives,
                     attempt, {**job_env, **_input_skip(runtime.ckpt_config.ckpt_dir,
                                                        num_workers)})
        except JobFailed as failure:
            say(str(failure))
            if failure.by_user or attempt == settings.max_restarts:
                _exit(failure.exit_code)
            say(f"restarting the job from the latest checkpoint in "
                f"{runtime.ckpt_config.ckpt_dir} (restart {attempt + 1} of "
                f"{settings.max_restarts})")
            if settings.base_port:
                time.sleep(GRACE_SECONDS)  # the same ports: let the last processes go
        else:
            _exit(0)


def _input_skip(ckpt_dir: Optional[str], num_workers: int) -> Dict[str, str]:
    """Where parallax.shard's input goes on, for a job that resumes a checkpoint of another
    number of workers (runtime/input_position.py); read again at each attempt."""
    _, record = input_position.resume_point(ckpt_dir)
    return {} if record is None else contracts.input_skip_env(record.skip_for(num_workers))


def say(text: str) -> None:
    """The driver's own lines, prefixed as the processes' lines are; a closed stderr is
    no reason to fail."""
    lines = text.splitlines() or [""]
    try:
        sys.stderr.write("".join(f"{DRIVER_PREFIX}{line}\n" for line in
                                 [f"parallax: {lines[0]}"] + lines[1:]))
        sys.stderr.flush()
    except (BrokenPipeError, OSError, ValueError):
        pass


def _exit(code: int) -> NoReturn:
    # Flushing a closed stdout at exit would print a BrokenPipeError: point it at /dev/null.
    try:
        sys.stdout.flush()
    except (BrokenPipeError, OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(code)


def _run_job(hosts, address, settings: Settings, runtime: RuntimeOptions, shell: Shell,
             with_servers: bool, collectives: str, attempt: int, job_env: Dict[str, str]
             ) -> None:
    """One attempt of the job: ports, rendezvous, control plane, processes; raises JobFailed."""
    slots = [(machine, host, slot) for machine, host in enumerate(hosts) for slot in host.slots]
    cluster = Cluster(worker_machines=[machine for machine, _, _ in slots],
                      collectives=collectives)
    if with_servers or collectives == "tensorflow":
        ports = _ports(hosts, settings, shell, with_servers)
        first = 1 if with_servers else 0
        cluster.servers = [f"{h.name}:{ports[h.name][0]}" for h in hosts] if with_servers else []
        cluster.workers = [f"{host.name}:{ports[host.name][first + host.slots.index(slot)]}"
                           for _, host, slot in slots]
    else:
        for host in hosts:
            if not is_local(host.name):
                _remote_free_ports(host, 0, shell)  # reached now, before anything starts
    if settings.redirect_path:
        os.makedirs(settings.redirect_path, exist_ok=True)
    with contextlib.ExitStack() as stack:
        rendezvous = None
        if collectives == "horovod":
            # Always: a get_runner after the first may need the collectives its plan did not.
            from runner.rendezvous import GlooRendezvous  # pylint: disable=C0415  (Horovod's)

            per_host: Dict[str, int] = {}
            for _, host, _ in slots:
                per_host[host.name] = per_host.get(host.name, 0) + 1
            rendezvous = stack.enter_context(GlooRendezvous(list(per_host.items()), address))
        specs = [_server_spec(index, host.name, cluster, settings, shell)
                 for index, host in enumerate(hosts) if with_servers]
        specs += [_worker_spec(rank, host.name, slot, cluster, rendezvous, settings, shell,
                               bool(runtime.ckpt_config.ckpt_dir))
                  for rank, (_, host, slot) in enumerate(slots)]
        control = ControlServer(uuid.uuid4().hex, [spec.name for spec in specs],
                                [spec.name for spec in specs if not spec.service],
                                settings.heartbeat_timeout_secs, settings.stall_timeout_secs,
                                address, log=say)
        stack.callback(control.stop)
        for spec in specs:
            spec.env.update(job_env)
            spec.env.update(control.env_for(spec.name))
        bar = sys.stderr.isatty() if settings.progress_bar is None else settings.progress_bar
        display = ProgressDisplay(control, settings.metrics_file, bar, attempt=attempt)
        stack.callback(display.close)
        # Paused for half the timeout, the driver may have missed beats of processes that
        # then stopped themselves: too long to go on as if nothing happened.
        run_processes(specs, watchdog=_watchdog(control, runtime.warn_unsharded_input),
                      write=display.write_line, pause_limit=settings.heartbeat_timeout_secs / 2)


def _watchdog(control: ControlServer, warn_unsharded_input: bool):
    """control.check, which says why the job must stop; and, once, the warning of workers
    that all read the same input, or whose first batches have rows in common
    (runtime/input_check.py)."""
    warned = not warn_unsharded_input

    def check(exited):
        nonlocal warned
        reported = None if warned else control.reported_digests()
        if reported is not None:  # every worker's first report, final
            warned = True
            same, shared = control.identical_digests(), input_check.shared_rows(reported)
            if same:
                say(input_check.warning(same, len(reported)))
            elif shared:
                say(input_check.shared_rows_warning(shared, len(reported)))
        return control.check(exited)
    return check


def _ports(hosts: List[Host], settings: Settings, shell: Shell, with_servers: bool
           ) -> Dict[str, List[int]]:
    """Ports for each host's server (`with_servers`) and workers: consecutive from
    settings.base_port when set, else free ones, asked on the host itself when it is remote. The local hosts (127.0.0.x)
    get theirs in one draw: their servers all listen on every address of this machine, so two
    draws could hand the same port to two of them."""
    counts = {host.name: int(with_servers) + len(host.slots) for host in hosts}
    if settings.base_port:
        return {name: list(range(settings.base_port, settings.base_port + count))
                for name, count in counts.items()}
    ports = {}
    local = [name for name in counts if is_local(name)]
    drawn = iter(free_ports(sum(counts[name] for name in local)))
    for name in local:
        ports[name] = [next(drawn) for _ in range(counts[name])]
    for host in hosts:
        if not is_local(host.name):
            ports[host.name] = _remote_free_ports(host, counts[host.name], shell)
    return ports


def _remote_free_ports(host: Host, count: int, shell: Shell) -> List[int]:
    try:
        return remote_free_ports(host.name, count, shell)
    except HostUnreachable as error:
        raise ParallaxError(f"{host.where}: {error}") from None


def _address_towards(host: Host) -> str:
    """This machine's address on the route to `host`: where remote ranks find the rendezvous."""
    family = socket.AF_INET6 if ":" in host.address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host.address, 9))  # UDP: picks the route, sends nothing
        except socket.gaierror as error:
            raise ParallaxError(f"{host.where}: host {host.name!r} does not resolve "
                                f"({error.strerror}); check its spelling, or use its "
                                "address") from None
        except OSError as error:
            raise ParallaxError(f"{host.where}: no route to host {host.name!r} ({error})") from None
        return probe.getsockname()[0]


def _job_env(cluster: Cluster, role_name: str) -> Dict[str, str]:
    # TensorFlow's log level comes with the driver's environment (parallax/tf_logs.py).
    return {**contracts.process_env(role_name, cluster), "PYTHONUNBUFFERED": "1"}


def _spec(name, host, argv, env, settings, shell, service=False) -> ProcessSpec:
    log_file = (os.path.join(settings.redirect_path, name.replace(":", "_") + ".log")
                if settings.redirect_path else None)
    return ProcessSpec(name=name, argv=argv, env=env, cwd=os.getcwd(), log_file=log_file,
                       host=None if is_local(host) else host, remote=shell, service=service)


def _server_spec(index: int, host: str, cluster: Cluster, settings: Settings, shell
                 ) -> ProcessSpec:
    env = _job_env(cluster, "server")
    env.update({**contracts.server_env(index), "CUDA_VISIBLE_DEVICES": ""})
    return _spec(f"{host}:server:{index}", host,
                 [sys.executable, "-m", "parallax.runtime.server"],
                 env, settings, shell, service=True)


def _worker_spec(rank, host, slot, cluster, rendezvous, settings, shell, saves_on_stop: bool
                 ) -> ProcessSpec:
    env = _job_env(dataclasses.replace(cluster, worker_id=rank), "worker")
    if rendezvous is not None:
        # Loopback 'machines' share this machine's 'lo'; a remote rank's gloo resolves its own
        # host name to find its address.
        env.update(rendezvous.env_for_rank(rank, gloo_iface="lo" if is_local(host) else None))
    env["CUDA_VISIBLE_DEVICES"] = str(slot)
    # orig_argv keeps interpreter options and '-m module', so the worker runs what the user ran.
    spec = _spec(f"{host}:worker:{rank}", host, [sys.executable] + sys.orig_argv[1:], env,
                 settings, shell)
    spec.hold_until_started = True  # what it prints before get_runner, the driver printed
    spec.stop_first = rank == 0 and saves_on_stop  # the chief saves on SIGTERM
    return spec
