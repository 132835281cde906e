"""The real `danube-client` 0.5.0 from PyPI in its own virtual environment.

It imports as ``danube`` like this project, so it cannot share an interpreter
with it: the venv lives in ``<repo>/.venvs/danube-client`` (gitignored), is
created on first use and reused afterwards, and scripts run in it as
subprocesses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_DIR = os.path.join(REPO, ".venvs", "danube-client")
PACKAGE = "danube-client==0.5.0"
SCRIPTS = os.path.join(REPO, "tests", "e2e", "danube_client_scripts")


def python_path() -> str:
    return os.path.join(VENV_DIR, "bin", "python")


def _installed() -> bool:
    if not os.path.exists(python_path()):
        return False
    probe = subprocess.run(
        [python_path(), "-c", "import importlib.metadata as m, danube; print(m.version('danube-client'))"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return probe.returncode == 0 and probe.stdout.strip() == PACKAGE.split("==")[1]


def ensure_venv() -> str:
    """Create the venv and install danube-client if needed; return its python."""
    if _installed():
        return python_path()
    os.makedirs(os.path.dirname(VENV_DIR), exist_ok=True)
    venv.EnvBuilder(with_pip=True, clear=os.path.exists(VENV_DIR)).create(VENV_DIR)
    result = subprocess.run(
        [python_path(), "-m", "pip", "install", "-q", PACKAGE], capture_output=True, text=True, timeout=600
    )
    if result.returncode != 0 or not _installed():
        raise RuntimeError(f"installing {PACKAGE} into {VENV_DIR} failed:\n{result.stdout}\n{result.stderr}")
    return python_path()


def script_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_script(name: str, *args: str, **popen) -> subprocess.Popen:
    """Start a script from tests/e2e/danube_client_scripts in the client venv."""
    return subprocess.Popen(
        [python_path(), os.path.join(SCRIPTS, name), *map(str, args)],
        env=script_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=SCRIPTS,
        **popen,
    )


def run_script(name: str, *args: str, timeout: float = 60.0) -> dict:
    """Run a script to completion; it prints one JSON object on its last stdout line."""
    proc = start_script(name, *args)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"{name} {args} timed out after {timeout}s\nstdout:\n{out}\nstderr:\n{err[-5000:]}")
    return parse_result(name, proc.returncode, out, err)


def parse_result(name: str, returncode: int, out: str, err: str) -> dict:
    lines = [line for line in out.splitlines() if line.strip()]
    if returncode != 0 or not lines:
        raise AssertionError(f"{name} failed (exit {returncode})\nstdout:\n{out[-5000:]}\nstderr:\n{err[-5000:]}")
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError:
        raise AssertionError(f"{name} printed no JSON result\nstdout:\n{out[-5000:]}\nstderr:\n{err[-5000:]}")


if __name__ == "__main__":
    print(ensure_venv(), file=sys.stderr)
