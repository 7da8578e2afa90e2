"""runner/ starts and supervises processes and knows nothing about graphs."""
import subprocess
import sys


def test_runner_imports_no_tensorflow_and_no_parallax():
    code = ("import sys, runner, runner.ssh, runner.remote_exec, runner.free_ports; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'parallax', 'keras')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
