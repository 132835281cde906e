"""Free loopback ports chosen at run time."""

from __future__ import annotations

from danube.processes import accepts_connections, free_port  # noqa: F401 - re-exported for the tests


def wait_for_port(port: int, timeout: float = 30.0, host: str = "127.0.0.1") -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if accepts_connections(host, port):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")
