"""A small, bounded HTTP/1.1 server on asyncio streams: enough for a JSON API and a few static files.

Bounds: request head at most MAX_HEAD bytes, body at most MAX_BODY (Content-Length only: no chunked
uploads), MAX_CONNECTIONS at once, idle and read timeouts.  Anything beyond answers 4xx and closes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.parse
from dataclasses import dataclass, field
from typing import Awaitable, Callable

log = logging.getLogger("danube.gateway")

MAX_HEAD = 16 * 1024
MAX_BODY = 64 * 1024
MAX_CONNECTIONS = 128
IDLE_TIMEOUT_S = 30.0
READ_TIMEOUT_S = 10.0

_REASONS = {
    200: "OK",
    204: "No Content",
    304: "Not Modified",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    411: "Length Required",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


@dataclass
class Request:
    method: str
    path: str  # raw path, still percent-encoded
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: bytes = b""

    def segments(self) -> list[str]:
        """Path segments, each percent-decoded on its own (so %2F stays inside its segment)."""
        return [urllib.parse.unquote(s) for s in self.path.strip("/").split("/")] if self.path.strip("/") else []


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, doc, status: int = 200) -> "Response":
        return cls(status, json.dumps(doc, separators=(",", ":")).encode(), "application/json")


Handler = Callable[[Request], Awaitable[Response]]


def _error(status: int, message: str) -> Response:
    return Response.json({"error": message, "message": message}, status)


class HttpServer:
    def __init__(self, handler: Handler, host: str, port: int) -> None:
        self.handler = handler
        self.host, self.port = host, port
        self._server: asyncio.base_events.Server | None = None
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=MAX_HEAD)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._writers):
                w.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._slots.locked():
            await self._write(writer, _error(503, "too many connections"), keep_alive=False)
            writer.close()
            return
        async with self._slots:
            self._writers.add(writer)
            try:
                while await self._one(reader, writer):
                    pass
            except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
                pass
            finally:
                self._writers.discard(writer)
                writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            await self._write(writer, _error(431, f"request head over {MAX_HEAD} bytes"), keep_alive=False)
            return False
        except asyncio.IncompleteReadError:
            return False
        try:
            request_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
            method, target, version = request_line.split(" ")
            headers: dict[str, str] = {}
            for line in header_lines:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        except ValueError:
            await self._write(writer, _error(400, "malformed request"), keep_alive=False)
            return False
        if not version.startswith("HTTP/1."):
            await self._write(writer, _error(400, "HTTP/1.x only"), keep_alive=False)
            return False
        keep_alive = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        if "transfer-encoding" in headers:
            await self._write(writer, _error(411, "send the body with Content-Length"), keep_alive=False)
            return False
        length_text = headers.get("content-length", "0")
        if not length_text.isdigit():
            await self._write(writer, _error(400, "bad Content-Length"), keep_alive=False)
            return False
        length = int(length_text)
        if length > MAX_BODY:
            await self._write(writer, _error(413, f"request body over {MAX_BODY} bytes"), keep_alive=False)
            return False
        body = await asyncio.wait_for(reader.readexactly(length), READ_TIMEOUT_S) if length else b""
        path, _, query_text = target.partition("?")
        query = dict(urllib.parse.parse_qsl(query_text, keep_blank_values=True))
        request = Request(method.upper(), path, query, headers, body)
        try:
            response = await self.handler(request)
        except Exception:  # the handler maps known errors; anything else is a bug, logged once here
            log.exception("gateway: %s %s failed", method, path)
            response = _error(500, "internal error (see the gateway's log)")
        await self._write(writer, response, keep_alive, head_only=request.method == "HEAD")
        return keep_alive

    @staticmethod
    async def _write(
        writer: asyncio.StreamWriter, response: Response, keep_alive: bool, head_only: bool = False
    ) -> None:
        lines = [
            f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Status')}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}",
            "X-Content-Type-Options: nosniff",
            "Cache-Control: no-store",
            f"Connection: {'keep-alive' if keep_alive else 'close'}",
        ]
        lines += [f"{k}: {v}" for k, v in response.headers.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if not head_only:
            writer.write(response.body)
        await writer.drain()
