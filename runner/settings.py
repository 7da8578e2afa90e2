"""How runner/ starts and supervises a job's processes: its one settings object, as Horovod's
runner has one (parallax.Config hands it over: Config.launch_settings)."""
from __future__ import annotations

import dataclasses
from typing import Optional

from runner.ssh import SSHConfig


class SettingError(ValueError):
    """A wrong setting; `option` is its keyword, which the message names too (parallax.Config
    raises it as its own ConfigError: runner/ knows nothing of Parallax)."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option


@dataclasses.dataclass(frozen=True)
class Settings:
    """What runner/ reads: how it starts and supervises the job's processes.

    ssh: how to reach remote hosts; by default from PARALLAX_SSH_* environment variables and
        the user's ~/.ssh/config.
    base_port: when set, each host's server and workers use consecutive ports from it;
        otherwise free ports are picked on each host.
    redirect_path: a folder; when set, each process writes its output to its own log file
        there instead of streaming it to the driver's terminal.
    heartbeat_timeout_secs: every process the driver starts beats to it every few seconds; one
        silent this long (stopped, hung, cut off) stops the job, named. A process that hears
        nothing from the driver this long stops itself.
    stall_timeout_secs: a worker inside one run for this long (workers waiting for each other:
        a deadlock, or a step that never ends) stops the job, naming the workers behind.
    max_restarts: when the job fails (not when it is stopped on purpose), start it again, up
        to this many times.
    metrics_file: a file the driver appends the job's progress to, one JSON object a line.
    progress_bar: the driver's progress bar; None shows it when the driver's stderr is a
        terminal.
    """

    ssh: Optional[SSHConfig] = None
    base_port: Optional[int] = None
    redirect_path: Optional[str] = None
    heartbeat_timeout_secs: float = 30.0
    stall_timeout_secs: float = 300.0
    max_restarts: int = 0
    metrics_file: Optional[str] = None
    progress_bar: Optional[bool] = None

    def __post_init__(self):
        for option in ("heartbeat_timeout_secs", "stall_timeout_secs"):
            seconds = getattr(self, option)
            if not seconds > 0:
                raise SettingError(option, f"{option} (seconds) must be positive, got {seconds!r}")
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise SettingError("max_restarts", f"max_restarts must be a whole number >= 0, got "
                                               f"{self.max_restarts!r}")
