"""Start helper processes for tests and always stop them by their own PID."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Iterator, Sequence


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> int | None:
    """SIGTERM, then SIGKILL after ``timeout``; return the exit code."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait(timeout=timeout)
        except ProcessLookupError:
            pass
    return proc.returncode


@contextlib.contextmanager
def running(
    cmd: Sequence[str],
    *,
    env: dict | None = None,
    cwd: str | None = None,
    log_path: str | None = None,
    stop_timeout: float = 10.0,
) -> Iterator[subprocess.Popen]:
    """Run ``cmd`` for the duration of the block; the process is stopped even when the block fails."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(list(cmd), env=full_env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        stop_process(proc, stop_timeout)
        if log_path:
            log.close()
