"""`danube <command>`: each command lives in its own module under danube.cli.

A command module exposes ``register(subparsers)`` which adds its parser and sets
``func`` (a callable taking the parsed args and returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

COMMANDS = ["broker", "cluster", "demo", "produce", "consume", "bench", "admin", "spark"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="danube",
        description="danube: a Danube-compatible message broker with a native hot path.",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"danube.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"danube.cli.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    # Every command moves large buffers (the broker, bench, produce, consume): see _allocator.
    from danube import _allocator

    _allocator.tune()
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
