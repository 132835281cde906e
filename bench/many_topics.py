"""Many active topics with small batches: one broker, 1 topic against N topics, per sync mode.

    python bench/many_topics.py [--before /tmp/before/src] [--sync always interval never]
        [--topics 100] [--rate 25000] [--pace-ms 10] [--duration 5] [--connections 8]
        [--shape pair|many|idle] [--client-processes 1 2] [--syscalls]

For each sync mode: a broker (``danube broker --sync S`` on free loopback ports, stopped by PID),
then ``danube bench --service-url URL --broker-pid PID`` with 1 topic, and with ``--topics N
--producers N --consumers N --connections C``, each on a fresh broker.  With ``--before`` the
same pair also runs on a broker from that source tree (its core built in place), alternating
which tree goes first, so every ratio compares runs made minutes apart.  The bench client is
always this tree's.  Prints delivered msgs/s, publish->deliver p99, the broker's CPU per message
and per call, its threads, the bench client's CPU per message and per call with its busiest producer
and consumer process (in cores) and what limited the run (``limited_by``: the client, the broker, or
nothing), and the N-topic / 1-topic CPU ratio of each tree.  Delivery is counted: messages offered
by the schedule, sent, delivered and missing; ``delivered_per_s`` runs from the start to the last
delivery, so it is below the offered rate by the tail latency even when nothing is missing.
``--client-processes 1 2`` runs every N-topic shape once per number of bench producer processes.
``--syscalls`` also counts the broker's event-loop thread's read, write and epoll_pwait system calls
while the calls are made (``perf stat`` on the syscall tracepoints, in 250 ms intervals, the setup
left out) and prints them per call: how many frames each socket read and write carries, which the
number of connections decides more than the broker's code (docs/benchmarks.md, session 19 (D)).

``--shape many`` runs the other shape instead: ``--topics 1000`` topics at ``--rate`` in total
(10 msgs/s each by default) from as many producers over 50 connections.

``--shape idle``: ``--topics`` topics (200 by default) each get one message, the clients
disconnect, and the broker's CPU over the next ``--duration`` seconds and its threads are
printed: what idle topics cost.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
sys.path.insert(0, SRC)

from danube.cli._process import spawned_broker  # noqa: E402


@contextlib.contextmanager
def _pythonpath(path: str):
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = path
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


_SYSCALLS = ("read", "write", "epoll_pwait")


def _start_syscall_count(pid: int) -> tuple[subprocess.Popen, str, float] | None:
    """``perf stat`` on the syscall tracepoints of the broker's main (event-loop) thread, 250 ms
    intervals to a CSV file; None without perf."""
    if shutil.which("perf") is None:
        return None
    fd, path = tempfile.mkstemp(prefix="many-topics-perf-", suffix=".csv")
    os.close(fd)
    events = ",".join(f"syscalls:sys_enter_{name}" for name in _SYSCALLS)
    cmd = ["perf", "stat", "-x", ",", "-I", "250", "-t", str(pid), "-e", events, "-o", path]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, path, time.monotonic()


def _syscalls_per_call(counting, bench_started: float, duration: float, r: dict) -> dict:
    """The loop thread's syscalls per call over the measured window: from the end of the setup
    (the bench's ``setup_s``, counted from its own start, which comes up to a second after
    ``bench_started``) to the deadline, less a second at the start and half a second at the end."""
    proc, path, perf_started = counting
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=10)
    try:
        with open(path) as f:
            lines = f.readlines()
    finally:
        os.unlink(path)
    if not r.get("calls_per_s") or r.get("setup_s") is None:
        return {}
    begin = bench_started - perf_started + r["setup_s"] + 1.0
    return per_call_counts(lines, begin, begin + duration - 1.5, r["calls_per_s"])


def per_call_counts(lines: list[str], begin: float, end: float, calls_per_s: float, interval: float = 0.25) -> dict:
    """``perf stat -x , -I`` lines (interval end, count, unit, event, ...): each syscall's count over
    the intervals lying within [begin, end] seconds of perf's start, per call at ``calls_per_s``."""
    counts = dict.fromkeys(_SYSCALLS, 0)
    stamps = set()
    for line in lines:
        row = line.strip().split(",")
        try:
            stamp, count, event = float(row[0]), int(row[1]), row[3]
        except (ValueError, IndexError):
            continue  # comments, "<not counted>"
        name = event.rpartition("sys_enter_")[2]
        if name in counts and begin <= stamp - interval and stamp <= end:
            counts[name] += count
            stamps.add(stamp)
    if not stamps:
        return {}
    calls = calls_per_s * interval * len(stamps)
    return {f"{name}s_per_call": round(n / calls, 3) for name, n in counts.items()}


def run_one(tree: str, sync: str, bench_args: list[str], timeout: float, syscalls: bool = False) -> dict:
    with _pythonpath(tree), spawned_broker(sync) as broker:
        counting = _start_syscall_count(broker.proc.pid) if syscalls else None
        bench_started = time.monotonic()
        cmd = [
            sys.executable,
            "-m",
            "danube.cli.main",
            "bench",
            "--service-url",
            broker.service_url,
            "--broker-pid",
            str(broker.proc.pid),
            "--json",
            "--no-progress",
            *bench_args,
        ]
        try:
            out = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": SRC}
            )
        except subprocess.TimeoutExpired:
            if counting is not None:
                counting[0].kill()
            return {"errors": [f"bench did not finish within {timeout:.0f} s"]}
        try:
            r = json.loads(out.stdout)
        except json.JSONDecodeError:
            r = {"errors": [f"bench failed: {out.stderr[-500:]}"]}
        if counting is not None:
            duration = float(bench_args[bench_args.index("--duration") + 1])
            r["syscalls"] = _syscalls_per_call(counting, bench_started, duration, r)
        return r


async def _touch_topics(url: str, n: int) -> None:
    from danube.client import DanubeClient

    client = DanubeClient.builder().service_url(url).build()
    try:
        base = f"/default/idle-{os.getpid()}"
        for i in range(n):
            producer = client.new_producer().with_topic(f"{base}-{i}").with_name(f"idle-{i}").build()
            await producer.create()
            await producer.send(b"x")
            await producer.close()
    finally:
        await client.close()


def run_idle(tree: str, sync: str, topics: int, seconds: float) -> dict:
    import asyncio
    import time

    from danube.processes import cpu_seconds, thread_count

    with _pythonpath(tree), spawned_broker(sync) as broker:
        asyncio.run(_touch_topics(broker.service_url, topics))
        time.sleep(1.0)  # the last closes settle
        c0 = cpu_seconds(broker.proc.pid)
        time.sleep(seconds)
        cpu = cpu_seconds(broker.proc.pid) - c0
        return {"idle_cpu_pct": round(cpu / seconds * 100, 1), "threads": thread_count(broker.proc.pid)}


def summary(r: dict, offered: float) -> dict:
    lat = r.get("deliver_latency_ms") or {}
    sent, delivered = r.get("sent") or 0, r.get("delivered") or 0
    offered_n = r.get("offered") or 0
    return {
        # counted: messages the schedule offered, made, and delivered within the drain timeout
        "offered": offered_n,
        "sent": sent,
        "delivered": delivered,
        "missing": r.get("missing", max(0, sent - delivered)),
        "delivered_of_offered": round(delivered / offered_n, 4) if offered_n else None,
        "delivered_per_s": r.get("end_to_end_rate"),  # start to last delivery: short by the tail latency
        "pacer_lag_ms": r.get("pacer_lag_ms"),
        "p99_ms": lat.get("p99"),
        "cpu_us_msg": r.get("broker_cpu_us_per_msg"),
        "cpu_us_call": r.get("broker_cpu_us_per_call"),
        "calls_s": r.get("calls_per_s"),
        "threads": r.get("broker_threads"),
        "broker_cores": r.get("broker_cores"),
        "sent_per_s_of_offered": round((r.get("sent_rate") or 0) / offered, 3),
        "client_procs": r.get("client_processes"),
        "client_us_msg": r.get("client_cpu_us_per_msg"),
        "client_us_call": r.get("client_cpu_us_per_call"),
        "client_cores": r.get("client_cores"),
        "producer_core": r.get("producer_core_max"),
        "consumer_core": r.get("consumer_core_max"),
        "machine_busy_pct": r.get("machine_busy_pct"),
        "limited_by": r.get("limited_by"),
        "setup_s": r.get("setup_s"),
        **({"loop_syscalls_per_call": r["syscalls"]} if "syscalls" in r else {}),
        "errors": (r.get("errors") or [])[:2],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default=None, help="src dir of the tree to compare with")
    ap.add_argument("--sync", nargs="+", default=["always", "interval", "never"])
    ap.add_argument("--shape", choices=["pair", "many", "idle"], default="pair")
    ap.add_argument("--topics", type=int, default=None)
    ap.add_argument("--rate", type=float, default=None)
    ap.add_argument("--pace-ms", type=float, default=10.0)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--connections", type=int, default=None)
    ap.add_argument(
        "--client-processes",
        type=int,
        nargs="+",
        default=[1],
        help="run each shape with each of these `danube bench --client-processes` (the 1-topic shape always with 1)",
    )
    ap.add_argument(
        "--syscalls", action="store_true", help="count the loop thread's read/write/epoll calls per call (perf)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    trees = [("after", SRC)] + ([("before", os.path.abspath(args.before))] if args.before else [])
    common = ["--duration", str(args.duration), "--pace-ms", str(args.pace_ms)]
    if args.shape == "idle":
        for i, sync in enumerate(args.sync):
            for name, tree in trees if i % 2 == 0 else list(reversed(trees)):
                row = {
                    "tree": name,
                    "sync": sync,
                    "topics": args.topics or 200,
                    **run_idle(tree, sync, args.topics or 200, args.duration),
                }
                print(json.dumps(row), flush=True)
        return
    if args.shape == "pair":
        n = args.topics or 100
        rate = args.rate or 25000
        shapes = [
            ("1 topic", ["--rate", str(rate)]),
            (
                f"{n} topics",
                [
                    "--rate",
                    str(rate),
                    "--topics",
                    str(n),
                    "--producers",
                    str(n),
                    "--consumers",
                    str(n),
                    "--connections",
                    str(args.connections or 8),
                ],
            ),
        ]
    else:
        n = args.topics or 1000
        rate = args.rate or 10.0 * n
        shapes = [
            (
                f"{n} topics",
                [
                    "--rate",
                    str(rate),
                    "--topics",
                    str(n),
                    "--producers",
                    str(n),
                    "--consumers",
                    str(n),
                    "--connections",
                    str(args.connections or 50),
                ],
            )
        ]
    rows = []
    for i, sync in enumerate(args.sync):
        order = trees if i % 2 == 0 else list(reversed(trees))
        for name, tree in order:
            for label, extra in shapes:
                for procs in args.client_processes if label != "1 topic" else [1]:
                    # setting up a thousand producers and consumers takes minutes on a busy 2-core VM
                    r = run_one(
                        tree,
                        sync,
                        common + extra + ["--client-processes", str(procs)],
                        timeout=args.duration + 150 + 1.0 * n,
                        syscalls=args.syscalls,
                    )
                    row = {"tree": name, "sync": sync, "shape": label, **summary(r, rate)}
                    rows.append(row)
                    if not args.json:
                        print(json.dumps(row), flush=True)
    if args.shape == "pair":
        for sync in args.sync:
            for name, _ in trees:
                got = {
                    r["shape"]: r
                    for r in rows
                    if r["sync"] == sync and r["tree"] == name and r["client_procs"] in (1, None)
                }
                one, many = got.get("1 topic"), got.get(f"{n} topics")
                if one and many and one["cpu_us_msg"] and many["cpu_us_msg"]:
                    print(
                        f"{sync:<9} {name:<7} CPU/msg {n} topics / 1 topic = "
                        f"{many['cpu_us_msg'] / one['cpu_us_msg']:.2f}"
                    )
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
