"""Shared by `danube produce`, `danube consume` and `danube bench`: options, event loop, exit codes."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any, Callable, Coroutine

from danube.errors import DanubeError

EXIT_OK = 0
EXIT_FAILED = 1  # the broker refused or the connection failed for good
EXIT_USAGE = 2  # argparse's own code for bad options
EXIT_INCOMPLETE = 3  # ran, but fewer messages than asked for (timeout)
EXIT_INTERRUPTED = 130

SUBSCRIPTION_TYPES = ["exclusive", "shared", "failover", "key_shared"]

log = logging.getLogger("danube.cli")


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--service-url", default="http://127.0.0.1:6650", help="broker URL (default http://127.0.0.1:6650)"
    )
    parser.add_argument("--topic", default="/default/demo", help="topic as /namespace/topic (default /default/demo)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--reliable",
        dest="reliable",
        action="store_true",
        default=True,
        help="WAL-backed topic, at-least-once (default)",
    )
    group.add_argument("--non-reliable", dest="reliable", action="store_false", help="in-memory topic, at-most-once")
    security = parser.add_argument_group("security (docs/security.md)")
    security.add_argument("--tls-ca", default=None, metavar="PEM", help="CA of the broker's certificate: use TLS")
    security.add_argument("--tls-cert", default=None, metavar="PEM", help="client certificate (mTLS, with --tls-key)")
    security.add_argument("--tls-key", default=None, metavar="PEM", help="the client certificate's private key")
    security.add_argument("--token", default=None, help="JWT sent on every call (default $DANUBE_TOKEN; implies TLS)")


def with_security(builder, args):
    """A DanubeClient builder with the --tls-* and --token options (and $DANUBE_TOKEN) applied."""
    import os

    token = getattr(args, "token", None) or os.environ.get("DANUBE_TOKEN")
    if getattr(args, "tls_cert", None) or getattr(args, "tls_key", None):
        if not (args.tls_cert and args.tls_key and args.tls_ca):
            raise DanubeError("mTLS needs --tls-ca, --tls-cert and --tls-key")
        builder = builder.with_mtls(args.tls_ca, args.tls_cert, args.tls_key)
    elif getattr(args, "tls_ca", None):
        builder = builder.with_tls(args.tls_ca)
    if token:
        builder = builder.with_token(token)
    return builder


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def run_async(main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """Runs ``main`` on uvloop (when installed); DanubeErrors become a one-line message and exit 1."""
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        factory = None
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(main())
    except DanubeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
