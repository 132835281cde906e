"""The broker before and after a change, in one run: two source trees, rounds interleaved.

    git worktree add --detach /tmp/before <commit>          # and build its core in place:
    (cd /tmp/before && python setup.py build_ext --inplace -t build/tmp-bench)
    python -m bench.broker_ab --before /tmp/before/src --after src [--rounds 8] [--json]

Two measurements, each run once per tree per round, alternating which tree goes first:

- **end to end**: a broker from each tree runs side by side (``danube broker`` subprocesses on free
  loopback ports, ``--sync interval``, stopped by PID); ``danube bench --service-url ... --rate R
  --duration D`` (the *before* tree's client for both, so only the broker differs) drives one
  consumer (exclusive) and two (shared). Reported: publish→deliver p50/p99 and the broker's CPU
  per delivered message (``/proc/<pid>/stat`` around the run), which the machine's load moves
  much less than the latencies;
- **dispatch path** (``--no-e2e`` skips the above): BrokerService without gRPC in one process per
  tree, WAL ``sync=never``: publish 1000-message batches, receive, ack; CPU per message for
  exclusive, shared (2 consumers), failover (2) and key_shared (2, 64 keys).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from danube.processes import free_port

TICK = os.sysconf("SC_CLK_TCK")

# One process per tree and sub type: publish, receive and ack; prints CPU ns per message.
_DISPATCH = r"""
import asyncio, json, sys, tempfile, time
import uvloop
from danube import message_codec
from danube.broker import BrokerService, DispatchSettings
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.storage.config import StorageConfig
from danube.storage.factory import StorageFactory

async def run(sub_type, batches, consumers):
    size = 1000
    with tempfile.TemporaryDirectory() as d:
        md = EmbeddedMetadataStore(f"{d}/m.db")
        f = StorageFactory(StorageConfig.from_dict({"wal": {"sync": "never"}}, data_dir=d), md, broker_id="b")
        b = BrokerService(md, f, dispatch=DispatchSettings(max_unacked_messages=1 << 30))
        await b.start()
        pid = await b.create_producer("/default/ab", "p", reliable=True)
        cids = [await b.subscribe("/default/ab", "s", f"c{i}", sub_type=sub_type) for i in range(consumers)]
        total, got = batches * size, 0

        async def consume(cid):
            nonlocal got
            while got < total:
                dl = await b.receive(cid, max_messages=size, max_bytes=1 << 22)
                got += dl.count
                if sub_type == "key_shared" or dl.redelivery_counts:
                    await b.ack(cid, [r.offset for r in frames.iter_records(dl.frames)])
                else:
                    await b.ack_ranges(cid, [(dl.first_offset, dl.last_offset)])

        tasks = [asyncio.ensure_future(consume(c)) for c in cids]
        c0 = time.process_time()
        for i in range(batches):
            key = f"k{i % 64}" if sub_type == "key_shared" else None
            await b.publish(pid, bytearray(frames.encode_payloads([b"x" * 100] * size, key=key)))
            await asyncio.sleep(0)
        while got < total:
            await asyncio.sleep(0.001)
        cpu = time.process_time() - c0
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await b.stop()
        await md.close()
        return cpu / total * 1e9

sub_type, batches, consumers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
print(json.dumps(uvloop.run(run(sub_type, batches, consumers))))
"""

DISPATCH_CASES = [("exclusive", 600, 1), ("shared", 600, 2), ("failover", 600, 2), ("key_shared", 60, 2)]
E2E_CASES = [("exclusive", []), ("shared", ["--consumers", "2"])]


def _cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _env(src: str) -> dict:
    return {**os.environ, "PYTHONPATH": os.path.abspath(src)}


def _start_broker(src: str, data_dir: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "danube.cli.main",
        "broker",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--admin-port",
        "0",
        "--metrics-port",
        "0",
        "--data-dir",
        data_dir,
        "--sync",
        "interval",
        "--load-report-interval",
        "0",
    ]
    proc = subprocess.Popen(cmd, env=_env(src), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        if proc.poll() is not None:
            raise RuntimeError(f"broker from {src} exited with {proc.returncode}")
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"broker from {src} did not listen on {port}")


def _order(trees: dict, r: int) -> list[str]:
    names = list(trees)
    return names if r % 2 == 0 else names[::-1]


def run_e2e(trees: dict, rounds: int, rate: int, duration: float) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="broker-ab-") as tmp:
        brokers = {}
        try:
            for name, src in trees.items():
                brokers[name] = _start_broker(src, os.path.join(tmp, name))
            for r in range(rounds):
                for case, extra in E2E_CASES:
                    for name in _order(trees, r):
                        proc, port = brokers[name]
                        before = _cpu_s(proc.pid)
                        out = subprocess.run(
                            [
                                sys.executable,
                                "-m",
                                "danube.cli.main",
                                "bench",
                                "--service-url",
                                f"http://127.0.0.1:{port}",
                                "--rate",
                                str(rate),
                                "--duration",
                                str(duration),
                                "--json",
                                "--no-progress",
                                *extra,
                            ],
                            env=_env(trees["before"]),
                            capture_output=True,
                            text=True,
                            check=True,
                        )
                        cpu = _cpu_s(proc.pid) - before
                        d = json.loads(out.stdout)
                        rows.append(
                            {
                                "tree": name,
                                "case": case,
                                "round": r,
                                "delivered": d["delivered"],
                                "all_delivered": d["delivered"] == d["acked"],
                                "p50_ms": d["deliver_latency_ms"]["p50"],
                                "p99_ms": d["deliver_latency_ms"]["p99"],
                                "broker_cpu_ns_per_msg": cpu / max(1, d["delivered"]) * 1e9,
                                "load": d["machine"]["load_before"],
                            }
                        )
        finally:
            for proc, _port in brokers.values():
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
    return rows


def run_dispatch(trees: dict, rounds: int) -> list[dict]:
    rows = []
    for r in range(rounds):
        for case, batches, consumers in DISPATCH_CASES:
            for name in _order(trees, r):
                out = subprocess.run(
                    [sys.executable, "-c", _DISPATCH, case, str(batches), str(consumers)],
                    env=_env(trees[name]),
                    capture_output=True,
                    text=True,
                    check=True,
                )
                rows.append({"tree": name, "case": case, "round": r, "cpu_ns_per_msg": json.loads(out.stdout)})
    return rows


def _medians(rows: list[dict], key: str) -> dict:
    out: dict = {}
    for row in rows:
        out.setdefault((row["case"], row["tree"]), []).append(row[key])
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="src directory of the tree before the change")
    ap.add_argument("--after", required=True, help="src directory of the tree after the change")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--dispatch-rounds", type=int, default=3)
    ap.add_argument("--rate", type=int, default=300_000)
    ap.add_argument("--duration", type=float, default=5)
    ap.add_argument("--no-e2e", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    trees = {"before": args.before, "after": args.after}
    result = {
        "e2e": [] if args.no_e2e else run_e2e(trees, args.rounds, args.rate, args.duration),
        "dispatch": run_dispatch(trees, args.dispatch_rounds),
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    if result["e2e"]:
        cpu, p50, p99 = (_medians(result["e2e"], k) for k in ("broker_cpu_ns_per_msg", "p50_ms", "p99_ms"))
        print(f"end to end, {args.rate:,} msg/s for {args.duration:g} s, medians of {args.rounds}:")
        for case, tree in sorted(cpu):
            print(
                f"  {case:10s} {tree:6s} broker CPU {cpu[case, tree]:6.0f} ns/msg  "
                f"p50 {p50[case, tree]:5.1f} ms  p99 {p99[case, tree]:6.1f} ms"
            )
        print("  every acked message delivered:", all(r["all_delivered"] for r in result["e2e"]))
    cpu = _medians(result["dispatch"], "cpu_ns_per_msg")
    print(f"dispatch path (no gRPC), CPU per message, medians of {args.dispatch_rounds}:")
    for case, tree in sorted(cpu):
        print(f"  {case:10s} {tree:6s} {cpu[case, tree]:7.0f} ns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
