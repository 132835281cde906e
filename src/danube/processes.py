"""Child server processes: free loopback ports, readiness, CPU and thread counts, stop by PID.

Below every layer that starts a server (the embedded etcd of `danube.cluster`, the CLI's `danube demo`
and `danube bench --spawn-broker`, the benchmarks and the test support), so each of them starts servers
on 127.0.0.1 ports chosen at run time and always stops what it started.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import time
from typing import Iterator, Sequence

# Ports handed out by this process: a server may not have bound its port yet when the next is asked for.
_handed_out: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _candidate_range() -> tuple[int, int]:
    """Ports outside the kernel's ephemeral range.  A port bound to 0 comes from that range, and so does
    the local end of every outgoing connection: between choosing it and the server binding it, a client
    socket (etcd, gRPC) can take it, and the server then fails with "Address already in use"."""
    low, high = _ephemeral_range()
    if low - 1 - 10000 >= 4096:
        return 10000, low - 1
    if 65535 - (high + 1) >= 4096:
        return high + 1, 65535
    return 0, 0


def free_port() -> int:
    """A loopback port that is free now, outside the ephemeral range, and not handed out before by this
    process (so a server that has not bound its port yet does not get a twin)."""
    first, last = _candidate_range()
    if first:
        for _ in range(200):
            port = random.randint(first, last)
            if port in _handed_out:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _handed_out.add(port)
    return port


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports (two binds in a row may hand out the same one)."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def accepts_connections(host: str, port: int) -> bool:
    """A server listens on ``host:port``.  A connect to a free port in the ephemeral range can
    succeed by connecting the socket to itself (TCP simultaneous open); that is not a server."""
    try:
        with socket.create_connection((host, port), timeout=0.5) as conn:
            return conn.getsockname() != conn.getpeername()
    except OSError:
        return False


def wait_for_port(port: int, proc: subprocess.Popen | None = None, timeout: float = 30.0) -> None:
    """Return once 127.0.0.1:``port`` accepts connections; RuntimeError if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before listening on port {port}")
        if accepts_connections("127.0.0.1", port):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing listened on 127.0.0.1:{port} within {timeout:.0f} s")
        time.sleep(0.05)


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds a process has used so far (0 for no pid or a process that is gone)."""
    if not pid:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_count(pid: int | None) -> int | None:
    """Threads of a process now (None for no pid or a process that is gone)."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def stop_process(proc: subprocess.Popen, timeout: float = 15.0) -> int:
    """SIGTERM, then SIGKILL after ``timeout``; the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@contextlib.contextmanager
def server_process(
    cmd: Sequence[str], port: int, *, log_path: str | None = None, stop_timeout: float = 15.0
) -> Iterator[subprocess.Popen]:
    """Run a server for the block once it listens on ``port``; stop it by its own PID even on failure."""
    log = open(log_path, "wb") if log_path else None
    proc = subprocess.Popen(list(cmd), stdout=subprocess.DEVNULL if log is None else log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, proc)
        yield proc
    finally:
        stop_process(proc, stop_timeout)
        if log is not None:
            log.close()
