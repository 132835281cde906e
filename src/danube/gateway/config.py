"""The gateway's settings: `danube admin serve` options over Danube's DANUBE_ADMIN_* variables."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from danube.errors import InvalidArgumentError

DEFAULT_LISTEN = "127.0.0.1:8080"
DEFAULT_ENDPOINT = "http://127.0.0.1:50051"


@dataclass
class GatewayConfig:
    mode: str = "ui"  # ui (HTTP API + console) | mcp (stdio) | all
    listen_addr: str = DEFAULT_LISTEN
    broker_endpoint: str = DEFAULT_ENDPOINT
    prometheus_url: str | None = None  # None: the embedded history answers /series
    request_timeout_s: float = 5.0
    cache_ttl_s: float = 3.0
    cors_allow_origin: str | None = None  # None: no CORS headers at all
    tls_enabled: bool = False
    tls_domain: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    token: str | None = None  # the gateway's own token for reads (DANUBE_ADMIN_TOKEN)
    metrics_urls: list[str] = field(default_factory=list)  # brokers' metrics, beyond what ListBrokers advertises
    scrape_interval_s: float = 5.0
    history_s: float = 3600.0
    max_history_topics: int = 2000
    read_only: bool = False  # refuse every action

    @property
    def actions_need_token(self) -> bool:
        """When the gateway itself needs a token the brokers require one: then so does every action."""
        return bool(self.token)

    def listen_host_port(self) -> tuple[str, int]:
        host, sep, port = self.listen_addr.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise InvalidArgumentError(f"--listen-addr {self.listen_addr!r}: expected HOST:PORT")
        return (host.strip("[]") or "0.0.0.0"), int(port)

    def grpc_target(self) -> str:
        endpoint = self.broker_endpoint.strip()
        for scheme in ("http://", "https://", "grpc://"):
            if endpoint.startswith(scheme):
                endpoint = endpoint[len(scheme) :]
                break
        return endpoint.rstrip("/")

    def uses_tls(self) -> bool:
        return bool(
            self.tls_enabled or self.tls_ca or self.tls_cert or self.broker_endpoint.strip().startswith("https://")
        )


def _env_bool(name: str) -> bool | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    return value.strip().lower() in ("1", "true", "yes", "on")


def from_args(args) -> GatewayConfig:
    """Options win over DANUBE_ADMIN_* variables, which win over the defaults (Danube's names)."""
    env = os.environ.get

    def pick(option, *names, default=None):
        if option is not None:
            return option
        for name in names:
            if env(name):
                return env(name)
        return default

    cfg = GatewayConfig(
        mode=str(pick(args.mode, "DANUBE_ADMIN_MODE", default="ui")).lower(),
        listen_addr=pick(args.listen_addr, "DANUBE_ADMIN_LISTEN_ADDR", default=DEFAULT_LISTEN),
        broker_endpoint=pick(
            args.broker_endpoint or getattr(args, "endpoint", None), "DANUBE_ADMIN_ENDPOINT", default=DEFAULT_ENDPOINT
        ),
        prometheus_url=pick(args.prometheus_url, "DANUBE_ADMIN_PROMETHEUS_URL"),
        request_timeout_s=args.request_timeout_ms / 1000.0,
        cache_ttl_s=args.cache_ttl_ms / 1000.0,
        cors_allow_origin=pick(args.cors_allow_origin, "DANUBE_ADMIN_CORS_ALLOW_ORIGIN"),
        tls_enabled=bool(
            args.grpc_enable_tls if args.grpc_enable_tls is not None else _env_bool("DANUBE_ADMIN_TLS") or False
        ),
        tls_domain=pick(args.grpc_domain, "DANUBE_ADMIN_DOMAIN"),
        tls_ca=pick(args.grpc_ca or getattr(args, "tls_ca", None), "DANUBE_ADMIN_CA", "DANUBE_ADMIN_TLS_CA"),
        tls_cert=pick(args.grpc_cert or getattr(args, "tls_cert", None), "DANUBE_ADMIN_CERT"),
        tls_key=pick(args.grpc_key or getattr(args, "tls_key", None), "DANUBE_ADMIN_KEY"),
        token=pick(getattr(args, "token", None), "DANUBE_ADMIN_TOKEN", "DANUBE_ADMIN_API_KEY"),
        metrics_urls=list(args.metrics_url or []),
        scrape_interval_s=args.scrape_interval,
        history_s=args.history_seconds,
        read_only=args.read_only,
    )
    if cfg.mode not in ("ui", "mcp", "all"):
        raise InvalidArgumentError(f"--mode {cfg.mode!r}: use ui, mcp or all")
    if (cfg.tls_cert is None) != (cfg.tls_key is None):
        raise InvalidArgumentError("mTLS needs both --grpc-cert and --grpc-key")
    if cfg.prometheus_url and not cfg.prometheus_url.startswith(("http://", "https://")):
        raise InvalidArgumentError(f"--prometheus-url {cfg.prometheus_url!r}: expected an http(s) URL")
    cfg.listen_host_port()
    return cfg
