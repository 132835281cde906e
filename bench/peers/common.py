"""Shared by the peer benchmarks: free ports, server processes stopped by PID, stamps, percentiles."""

from __future__ import annotations

import contextlib
import socket
import struct
import subprocess
import time
from dataclasses import dataclass, field

from danube.cli.bench import percentiles  # noqa: F401  (one latency summary for danube bench and the peers)

STAMP = struct.Struct("<d")   # perf_counter at send, first 8 bytes of every payload


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen | None = None, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")
            time.sleep(0.05)


@contextlib.contextmanager
def server_process(cmd: list[str], port: int, *, log_path: str | None = None):
    """Runs a server for the block and stops it by its own PID (SIGTERM, then SIGKILL)."""
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, proc)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if log_path:
            log.close()


def payload(size: int, now: float) -> bytes:
    if size < STAMP.size:
        return b"\x00" * size
    return STAMP.pack(now) + b"\x00" * (size - STAMP.size)


def sent_at(data) -> float | None:
    if len(data) < STAMP.size:
        return None
    return STAMP.unpack_from(data)[0]


@dataclass
class PeerResult:
    system: str
    mode: str                       # "max" or "rate=<n>"
    sent: int = 0
    delivered: int = 0
    seconds: float = 0.0
    end_to_end_rate: float = 0.0    # messages delivered / s
    publish_rate: float = 0.0       # messages acked / s
    deliver_latency_ms: dict = field(default_factory=dict)
    ack_latency_ms: dict = field(default_factory=dict)
    note: str = ""
