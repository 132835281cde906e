"""Start a real broker (`python -m danube.cli.main broker`) as a subprocess on free loopback ports.

The process is always stopped by its own PID (SIGTERM, then SIGKILL), even when
the test fails; its log is kept in the temp data dir for failure messages.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from tests.support.ports import free_port, wait_for_port
from tests.support.processes import stop_process


@dataclass
class BrokerProcess:
    data_dir: str
    port: int
    admin_port: int
    metrics_port: int
    log_path: str
    extra_args: Sequence[str] = ()
    env: dict | None = None
    proc: subprocess.Popen | None = None
    exit_codes: list = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        cmd = [
            sys.executable,
            "-m",
            "danube.cli.main",
            "broker",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--admin-port",
            str(self.admin_port),
            "--metrics-port",
            str(self.metrics_port),
            "--data-dir",
            self.data_dir,
            *self.extra_args,
        ]
        env = dict(os.environ)
        env.update(self.env or {})
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        try:
            wait_for_port(self.port, timeout=timeout)
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"broker did not start; log:\n{self.log()}")

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        code = stop_process(self.proc, timeout)
        self.exit_codes.append(code)
        self.proc = None
        return code

    def restart(self) -> None:
        self.stop()
        self.start()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.exit_codes.append(self.proc.returncode)
            self.proc = None

    def log(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()[-20000:]
        except OSError:
            return ""


@contextlib.contextmanager
def running_broker(*extra_args: str, data_dir: str | None = None, env: dict | None = None) -> Iterator[BrokerProcess]:
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="danube-broker-"))
        broker = BrokerProcess(
            data_dir=data_dir,
            port=free_port(),
            admin_port=free_port(),
            metrics_port=free_port(),
            log_path=os.path.join(data_dir, "broker.log"),
            extra_args=extra_args,
            env=env,
        )
        broker.start()
        try:
            yield broker
        finally:
            broker.stop()
