"""`danube admin serve` as a subprocess for tests, and a tiny JSON client for its HTTP API."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Iterator

from tests.support.ports import free_port, wait_for_port
from tests.support.processes import running


@dataclass
class Gateway:
    port: int
    log_path: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(
        self, method: str, path: str, body=None, headers: dict | None = None, timeout: float = 30.0
    ) -> tuple[int, dict, dict]:
        """(status, JSON body, response headers); HTTP errors are returned, not raised."""
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json"} if data is not None else {}
        hdrs.update(headers or {})
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read() or b"null"), dict(resp.headers)
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return exc.code, json.loads(raw) if raw else {}, dict(exc.headers)

    def get(self, path: str) -> dict:
        status, doc, _ = self.request("GET", path)
        assert status == 200, f"GET {path}: {status} {doc}"
        return doc

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()[-10000:]


@contextlib.contextmanager
def running_gateway(admin_port: int, log_dir: str, *extra: str, env: dict | None = None) -> Iterator[Gateway]:
    port = free_port()
    log_path = os.path.join(log_dir, f"gateway-{port}.log")
    cmd = [
        sys.executable,
        "-m",
        "danube.cli.main",
        "admin",
        "serve",
        "--listen-addr",
        f"127.0.0.1:{port}",
        "--broker-endpoint",
        f"http://127.0.0.1:{admin_port}",
        "--scrape-interval",
        "0.5",
        "--cache-ttl-ms",
        "0",
        *extra,
    ]
    with running(cmd, env=env, log_path=log_path) as proc:
        gateway = Gateway(port, log_path)
        try:
            wait_for_port(port, timeout=30)
        except TimeoutError:
            raise RuntimeError(f"gateway did not start (exit {proc.poll()}); log:\n{gateway.log()}")
        yield gateway
