"""Runs ported Danube broker tests in the danube-client venv and prints one JSON line.

usage: runner.py MODULE[,MODULE...] --url URL --admin-url URL [--only NAME ...] [--parallel N] [--scale F]

MODULE is a scenario file of this directory (``schema_compatibility`` ...).  Its tests are the
``async def test_<name>(ctx)`` functions; each raises (AssertionError, a client error) when the
Danube test would fail.  They run concurrently, at most ``--parallel`` at a time, each on its own
topics, and the result is ``{name: {"ok": bool, "error": str, "seconds": float}}`` (names are
``module::name`` when several modules run in one go).
"""

import argparse
import asyncio
import importlib
import inspect
import json
import sys
import time
import traceback

from common import Ctx


async def _run_one(name, fn, ctx, gate, results):
    async with gate:
        start = time.monotonic()
        try:
            await fn(ctx)
            results[name] = {"ok": True, "error": "", "seconds": round(time.monotonic() - start, 2)}
        except BaseException as exc:  # noqa: BLE001 - every failure is reported to pytest
            detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:]
            results[name] = {"ok": False, "error": detail, "seconds": round(time.monotonic() - start, 2)}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("module")
    ap.add_argument("--url", required=True)
    ap.add_argument("--admin-url", required=True)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--parallel", type=int, default=6)
    ap.add_argument("--scale", type=float, default=3.0)
    ap.add_argument("--run-id", default=str(int(time.time() * 1000)))
    args = ap.parse_args()
    modules = args.module.split(",")
    tests = {}
    for module_name in modules:
        module = importlib.import_module(module_name)
        prefix = f"{module_name}::" if len(modules) > 1 else ""
        found = [
            (fn.__code__.co_firstlineno, name, fn)
            for name, fn in inspect.getmembers(module, inspect.iscoroutinefunction)
            if name.startswith("test_")
        ]
        # in the file's order: with --parallel 1 a test may rely on the one before (as Danube's may)
        tests.update({prefix + name[len("test_") :]: fn for _, name, fn in sorted(found)})
    if args.only:
        tests = {n: tests[n] for n in args.only}
    ctx = Ctx(args.url, args.admin_url, args.run_id, args.scale)
    gate = asyncio.Semaphore(max(1, args.parallel))
    results: dict = {}
    await asyncio.gather(*(_run_one(n, fn, ctx, gate, results) for n, fn in tests.items()))
    await ctx.close()
    sys.stdout.write(json.dumps(results) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main())
