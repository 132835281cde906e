"""Routes, guards and the lifecycle of the HTTP gateway (`danube admin serve --mode ui`).

Guards, in order: the Host header must name this server when it listens on loopback (no DNS
rebinding); a cross-origin request is refused unless --cors-allow-origin names its origin; a POST
must be application/json (a cross-site form cannot post one without a CORS preflight); actions need
``Authorization: Bearer <token>`` when the gateway itself holds a token (the brokers require one),
and that token is what the broker authorizes; --read-only refuses every action.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from importlib import resources

from danube.errors import DanubeError, NotFoundError
from danube.gateway.actions import Actions, normalize_topic, parse_body
from danube.gateway.backend import AdminBackend
from danube.gateway.config import GatewayConfig
from danube.gateway.errors import GatewayRequestError, error_body, http_status
from danube.gateway.http import HttpServer, Request, Response
from danube.gateway.metrics import MetricsHub
from danube.gateway.pages import Pages
from danube.metadata.keys import check_name
from danube.schema.registry import check_subject

log = logging.getLogger("danube.gateway")

_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]", "::1")
_STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
_STATIC_FILES = ("index.html", "app.js", "app.css")
_CSP = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'"
MAX_CACHE_ENTRIES = 512


class Gateway:
    def __init__(self, cfg: GatewayConfig) -> None:
        self.cfg = cfg
        self.backend = AdminBackend(cfg)
        self.metrics = MetricsHub(cfg)
        self.pages = Pages(self.backend, self.metrics)
        self.actions = Actions(self.backend)
        self._cache: dict[str, tuple[float, dict]] = {}
        self._scraper: asyncio.Task | None = None
        self.http: HttpServer | None = None

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> int:
        host, port = self.cfg.listen_host_port()
        self.http = HttpServer(self.handle, host, port)
        await self.http.start()
        self._scraper = asyncio.create_task(self._scrape_loop(), name="gateway-scrape")
        return self.http.port

    async def close(self) -> None:
        if self._scraper is not None:
            self._scraper.cancel()
            await asyncio.gather(self._scraper, return_exceptions=True)
        if self.http is not None:
            await self.http.close()
        await self.backend.close()

    async def _scrape_loop(self) -> None:
        while True:
            try:
                brokers = await self.backend.list_brokers()
                await self.metrics.scrape(self.pages.metric_targets(brokers))
            except DanubeError as exc:
                log.warning("gateway: metrics round skipped: %s", exc)
            except Exception:  # keep scraping: one bad round must not end the history
                log.exception("gateway: metrics round failed")
            await asyncio.sleep(self.cfg.scrape_interval_s)

    # ------------------------------------------------------------ guards

    def _host_allowed(self, request: Request) -> bool:
        host, _ = self.cfg.listen_host_port()
        if host not in ("127.0.0.1", "localhost", "::1"):
            return True
        name = request.headers.get("host", "")
        name = name.rsplit(":", 1)[0] if not name.endswith("]") else name
        return name in _LOOPBACK_NAMES

    def _origin_allowed(self, request: Request) -> bool:
        origin = request.headers.get("origin")
        if not origin or origin == "null" and request.method in ("GET", "HEAD"):
            return True
        if self.cfg.cors_allow_origin and (self.cfg.cors_allow_origin == "*" or origin == self.cfg.cors_allow_origin):
            return True
        return origin.split("://", 1)[-1] == request.headers.get("host")

    def _cors(self, response: Response, request: Request) -> Response:
        origin = request.headers.get("origin")
        allowed = self.cfg.cors_allow_origin
        if allowed and origin and (allowed == "*" or origin == allowed):
            response.headers["Access-Control-Allow-Origin"] = "*" if allowed == "*" else origin
            response.headers["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
            response.headers["Access-Control-Allow-Headers"] = "Content-Type, Authorization"
            response.headers["Vary"] = "Origin"
        return response

    def _action_token(self, request: Request) -> str | None:
        if self.cfg.read_only:
            raise GatewayRequestError("this gateway is read-only (--read-only): actions are refused", 403)
        auth = request.headers.get("authorization", "")
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else None
        if self.cfg.actions_need_token and not token:
            raise GatewayRequestError(
                "the brokers require a token: send 'Authorization: Bearer <token>' with actions", 401
            )
        return token

    # ------------------------------------------------------------ dispatch

    async def handle(self, request: Request) -> Response:
        if not self._host_allowed(request):
            return Response.json(error_body(GatewayRequestError("unexpected Host header")), 403)
        if not self._origin_allowed(request):
            return Response.json(
                error_body(
                    GatewayRequestError(
                        "cross-origin request refused (CORS is off unless --cors-allow-origin names the origin)"
                    )
                ),
                403,
            )
        if request.method == "OPTIONS":
            return self._cors(Response(204, b"", "text/plain"), request)
        try:
            response = await self._route(request)
        except DanubeError as exc:
            response = Response.json(error_body(exc), http_status(exc))
        return self._cors(response, request)

    async def _route(self, request: Request) -> Response:
        seg = request.segments()
        method = request.method
        if seg[:2] != ["ui", "v1"]:
            if method in ("GET", "HEAD"):
                return self._static(seg)
            raise GatewayRequestError("not found", 404)
        rest = seg[2:]
        if method == "POST":
            if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
                raise GatewayRequestError("POST bodies must be application/json", 415)
            handler = {
                ("cluster", "actions"): self.actions.cluster,
                ("cluster", "rebalance"): self.actions.rebalance,
                ("topics", "actions"): self.actions.topic,
                ("schemas", "actions"): self.actions.schema,
            }.get(tuple(rest))  # type: ignore[arg-type]
            if handler is None:
                raise GatewayRequestError("not found", 404)
            token = self._action_token(request)
            doc = parse_body(request.body)
            result = await handler(doc, token)
            self._cache.clear()
            # as Danube's gateway: the broker answered, so 200; "success" says what it answered
            return Response.json(result)
        if method not in ("GET", "HEAD"):
            raise GatewayRequestError(f"{method[:10]} not allowed", 405)
        if rest == ["health"]:
            return Response.json(await self.pages.health())
        key = "/".join(rest) + "?" + "&".join(f"{k}={v}" for k, v in sorted(request.query.items()))
        if rest and rest[0] == "topics" and len(rest) >= 2 and rest[-1] == "series" and len(rest) == 3:
            return Response.json(await self.pages.series(self._topic(rest[1]), request.query))
        return Response.json(await self._cached(key, lambda: self._page(rest)))

    def _topic(self, raw: str) -> str:
        return normalize_topic(raw, None)

    def _page(self, rest: list[str]):
        p = self.pages
        match rest:
            case ["cluster"]:
                return p.cluster()
            case ["cluster", "balance"]:
                return p.balance()
            case ["cluster", "rebalancing-history"]:
                return p.rebalancing_history()
            case ["topics"]:
                return p.topics()
            case ["namespaces"]:
                return p.namespaces()
            case ["brokers", broker_id]:
                return p.broker(check_name("broker", broker_id))
            case ["topics", topic]:
                return p.topic(self._topic(topic))
            case ["schemas"]:
                return p.schemas()
            case ["schemas", subject]:
                return p.schema(check_subject(subject))
        raise NotFoundError("not found")

    async def _cached(self, key: str, make) -> dict:
        hit = self._cache.get(key)
        now = time.monotonic()
        if hit is not None and hit[0] > now:
            return hit[1]
        value = await make()
        if len(self._cache) >= MAX_CACHE_ENTRIES:
            self._cache.clear()
        self._cache[key] = (now + self.cfg.cache_ttl_s, value)
        return value

    def _static(self, seg: list[str]) -> Response:
        name = "index.html" if not seg else seg[-1] if seg[:1] == ["static"] and len(seg) == 2 else None
        if name not in _STATIC_FILES:
            raise GatewayRequestError("not found", 404)
        body = resources.files("danube.gateway").joinpath("static", name).read_bytes()
        suffix = name[name.rfind(".") :]
        return Response(200, body, _STATIC_TYPES[suffix], {"Content-Security-Policy": _CSP})


async def serve(cfg: GatewayConfig, ready=None) -> None:
    """Serve until SIGTERM/SIGINT (or cancelled); ``ready(port)`` is called once the port listens."""
    gateway = Gateway(cfg)
    port = await gateway.start()
    host, _ = cfg.listen_host_port()
    log.info(
        "danube admin gateway on http://%s:%d (broker %s, series from %s)",
        host,
        port,
        cfg.broker_endpoint,
        cfg.prometheus_url or "the embedded history",
    )
    # stderr: in --mode all stdout carries MCP
    print(f"danube admin gateway listening on http://{host}:{port}", file=sys.stderr, flush=True)
    if ready is not None:
        ready(port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await gateway.close()
