"""`danube admin serve`: the options (Danube's names and DANUBE_ADMIN_* variables) and the entry point."""

from __future__ import annotations

import sys

from danube.gateway.config import DEFAULT_ENDPOINT, DEFAULT_LISTEN


def _bool(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


def add_parser(groups) -> None:
    p = groups.add_parser(
        "serve",
        help="serve Danube's admin HTTP API, a web console, or MCP over stdio (docs/gateway.md)",
        description="Danube's admin gateway: --mode ui serves the HTTP/JSON API Danube's Admin UI uses and a "
        "built-in web console at /; --mode mcp speaks MCP over stdio.",
    )
    p.add_argument(
        "--mode",
        default=None,
        choices=["ui", "mcp", "all"],
        help="ui (HTTP API and console), mcp (stdio) or all [default $DANUBE_ADMIN_MODE or ui]",
    )
    p.add_argument(
        "--listen-addr",
        default=None,
        help=f"HTTP listen address [default $DANUBE_ADMIN_LISTEN_ADDR or {DEFAULT_LISTEN}]",
    )
    p.add_argument(
        "--broker-endpoint",
        default=None,
        help=f"a broker's admin gRPC endpoint [default $DANUBE_ADMIN_ENDPOINT or {DEFAULT_ENDPOINT}]",
    )
    p.add_argument(
        "--prometheus-url",
        default=None,
        help="Prometheus base URL for the charts [default: an embedded history of the brokers' metrics]",
    )
    p.add_argument(
        "--metrics-url",
        action="append",
        default=None,
        metavar="URL",
        help="a broker metrics page to scrape beyond those the brokers advertise (repeatable)",
    )
    p.add_argument("--scrape-interval", type=float, default=5.0, help="seconds between scrapes [default 5]")
    p.add_argument(
        "--history-seconds", type=float, default=3600.0, help="how far back the embedded history reaches [default 3600]"
    )
    p.add_argument("--request-timeout-ms", type=int, default=5000, help="admin RPC deadline [default 5000]")
    p.add_argument("--cache-ttl-ms", type=int, default=3000, help="page cache lifetime [default 3000]")
    p.add_argument(
        "--cors-allow-origin", default=None, help="the one origin (or *) browsers may call from [default: CORS off]"
    )
    p.add_argument("--read-only", action="store_true", help="refuse every action")
    p.add_argument("--grpc-enable-tls", type=_bool, default=None, metavar="BOOL", help="TLS to the broker")
    p.add_argument("--grpc-domain", default=None, help="the name the broker's certificate is checked against")
    p.add_argument("--grpc-ca", default=None, metavar="PEM", help="CA of the broker's certificate")
    p.add_argument("--grpc-cert", default=None, metavar="PEM", help="client certificate (mTLS)")
    p.add_argument("--grpc-key", default=None, metavar="PEM", help="its private key")
    p.add_argument(
        "--mcp-allow-actions",
        action="store_true",
        help="MCP mode: offer the tools that change the cluster (read-only without)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    import logging

    from danube.errors import DanubeError
    from danube.gateway.config import from_args

    try:
        cfg = from_args(args)
    except DanubeError as exc:
        print(f"danube admin serve: {exc}", file=sys.stderr)
        return 2
    from danube.cli._client_common import run_async

    if cfg.mode in ("mcp", "all"):
        try:
            import mcp  # noqa: F401
        except ImportError:
            print(
                "danube admin serve: --mode mcp needs the MCP SDK: pip install 'danube-broker[gateway]'",
                file=sys.stderr,
            )
            return 2

    if cfg.mode == "mcp":
        logging.getLogger().handlers.clear()  # stdout carries the protocol: logs go to stderr only
        logging.basicConfig(stream=sys.stderr, level=logging.WARNING, force=True)
        from danube.gateway.mcp_tools import serve_stdio

        return run_async(lambda: serve_stdio(cfg, allow_actions=args.mcp_allow_actions))

    async def main() -> int:
        from danube.gateway.app import serve

        if cfg.mode == "all":
            import asyncio

            from danube.gateway.mcp_tools import serve_stdio

            await asyncio.gather(serve(cfg), serve_stdio(cfg, allow_actions=args.mcp_allow_actions))
        else:
            await serve(cfg)
        return 0

    try:
        return run_async(main)
    except OSError as exc:
        print(f"danube admin serve: {exc}", file=sys.stderr)
        return 1
