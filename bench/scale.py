"""One broker at scale: per-topic disk, memory and descriptors, restart time, ratios.

    python bench/scale.py [--topics 10000] [--concurrency 64] [--idle-close 5] [--skip-ratios]
                          [--ratio-seconds 5] [--dir DIR] [--json-out bench/out/scale-<time>.json]

What it does, against one `danube broker` subprocess (sync=always, native server):

1. creates ``--topics`` reliable topics ``/default/scale-00000..``: one producer each sends one
   100 B message (``--concurrency`` at a time, over one client connection) and closes;
2. reads the broker's RSS (/proc VmRSS), open descriptors (/proc/<pid>/fd) and the WAL's disk
   use (allocated blocks, ``st_blocks``) right after, and again once every topic's WAL was closed
   as idle (``storage.wal.idle_close_seconds``, ``--idle-close``); per-topic figures are
   (after - before the topics) / topics;
3. kills the broker with SIGKILL (a crash), starts a new one over the same data directory and
   times how long until its first request is served (a producer's send acked), then sends a
   second message to every topic (each must get offset 1: the topic was recovered), stops the
   broker and opens every topic's WAL in this process to check both records byte for byte;
4. unless ``--skip-ratios``: the scale ratios in the same run --
   - 100 topics (one producer and one consumer each, 100 B, batch lane) aggregate publish rate
     against one topic's (``danube bench --topics``), sync=always;
   - 1 KiB and 64 KiB payloads end to end (sync=always) against the disk's fdatasync'd write
     bandwidth (64 KiB ``pwrite`` + ``fdatasync`` in a loop: ``dd oflag=dsync`` in Python);
   - the embeddable WAL's per-record ``append()`` (100 B, sync=never, fresh log) against a
     plain-Python loop writing the same frame bytes with ``struct.pack`` + buffered ``write``.

Prints a table and writes the JSON to ``bench/out/``.  Needs ``ulimit -n`` above the topic count
only for the broker (it raises its own soft limit).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from danube.processes import free_ports, stop_process, wait_for_port

HERE = os.path.dirname(os.path.abspath(__file__))
PAYLOAD = b"s" * 100


def topic_name(i: int) -> str:
    return f"/default/scale-{i:05d}"


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def disk_used(root: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


def topics_holding_files(pid: int, wal_root: str) -> dict[str, int]:
    """WAL directories in which the broker holds more than the lock file open (not idle-closed),
    with the count of descriptors held there."""
    held: dict[str, int] = {}
    root = os.path.realpath(wal_root) + os.sep
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(root):
            d = os.path.dirname(target)[len(root) :]
            held[d] = held.get(d, 0) + 1
    return {d: n for d, n in sorted(held.items()) if n > 1}


def thread_names(pid: int) -> dict[str, int]:
    """The broker's Python threads by name (``py-spy dump``; empty when py-spy is not installed)."""
    if shutil.which("py-spy") is None:
        return {}
    try:
        text = subprocess.run(["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    names: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("Thread ") and '"' in line:
            name = line.split('"')[1]
            names[name] = names.get(name, 0) + 1
    return dict(sorted(names.items()))


def snapshot(pid: int, wal_root: str) -> dict:
    return {"rss": rss(pid), "fds": descriptors(pid), "threads": threads(pid), "disk": disk_used(wal_root)}


class Broker:
    def __init__(self, data_dir: str, idle_close: float, max_connections: int, log_level: str = "INFO") -> None:
        self.data_dir = data_dir
        self.log_level = log_level
        self.config = os.path.join(data_dir, "scale-broker.yml")
        with open(self.config, "w") as f:
            json.dump(
                {
                    "storage": {"mode": "local", "wal": {"idle_close_seconds": idle_close}},
                    "http2": {"max_connections": max_connections},
                },
                f,
            )  # JSON is YAML
        self.port, self.admin_port = free_ports(2)
        self.proc: subprocess.Popen | None = None
        self.log = open(os.path.join(data_dir, "broker.log"), "ab")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> float:
        """Start; return the time.monotonic() of the spawn."""
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "danube.cli.main",
                "--log-level",
                self.log_level,
                "broker",
                "--config",
                self.config,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--admin-port",
                str(self.admin_port),
                "--metrics-port",
                "0",
                "--data-dir",
                self.data_dir,
                "--sync",
                "always",
                "--load-report-interval",
                "0",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        return t0

    def wait_listening(self) -> None:
        wait_for_port(self.port, self.proc, timeout=120)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop_process(self.proc, 60)


async def _send_one(client, i: int, payload: bytes, sem: asyncio.Semaphore) -> int:
    async with sem:
        producer = client.new_producer().with_topic(topic_name(i)).with_name(f"scale-{i}").with_reliable().build()
        await producer.create()
        try:
            return await producer.send_and_wait(payload)
        finally:
            await producer.close()


async def send_to_all(url: str, topics: int, concurrency: int, payload: bytes) -> list[int]:
    from danube.client import DanubeClient

    client = DanubeClient.builder().service_url(url).build()
    sem = asyncio.Semaphore(concurrency)
    try:
        return await asyncio.gather(*(_send_one(client, i, payload, sem) for i in range(topics)))
    finally:
        await client.close()


async def first_request(url: str, deadline_s: float = 120.0) -> None:
    """Retry a producer's send on topic 0 until it is acked (the broker may not listen yet)."""
    from danube.client import DanubeClient

    end = time.monotonic() + deadline_s
    while True:
        try:
            client = DanubeClient.builder().service_url(url).build()
            try:
                await _send_one(client, 0, b"first-request", asyncio.Semaphore(1))
                return
            finally:
                await client.close()
        except Exception:  # noqa: BLE001 - not up yet
            if time.monotonic() > end:
                raise
            await asyncio.sleep(0.02)


def check_wals(wal_root: str, topics: int) -> list[str]:
    """Open every topic's WAL here and check its records; return the problems found."""
    from danube.storage.paths import topic_dir
    from danube.wal import Wal

    problems = []
    for i in range(topics):
        path = topic_dir(wal_root, topic_name(i))
        try:
            with Wal.open(path, sync="never") as wal:
                payloads = [bytes(r.payload) for r in wal.read(0)]
        except Exception as exc:  # noqa: BLE001 - reported
            problems.append(f"{topic_name(i)}: {exc}")
            continue
        want = [PAYLOAD, b"second"] + ([b"first-request"] * 2 if i == 0 else [])
        if sorted(payloads) != sorted(want):
            problems.append(f"{topic_name(i)}: {len(payloads)} records, expected {len(want)}")
    return problems


# ------------------------------------------------------------------ ratios


def disk_dsync_bandwidth(directory: str, total: int = 64 << 20, block: int = 64 << 10) -> float:
    """Bytes/s of 64 KiB pwrite + fdatasync into a fresh file (as ``dd bs=64k oflag=dsync``)."""
    path = os.path.join(directory, "dsync.dat")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    data = os.urandom(block)
    try:
        t0 = time.perf_counter()
        for pos in range(0, total, block):
            os.pwrite(fd, data, pos)
            os.fdatasync(fd)
        return total / (time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)


def append_vs_struct_loop(directory: str, n: int = 200_000, reps: int = 20) -> dict:
    """Per-record ``Wal.append`` (100 B, sync=never, fresh log) vs a plain-Python loop writing the
    same frame bytes with struct.pack + buffered write: ``bench/wal_append_ratio.py``'s
    measurement (both in this process, interleaved, ``reps`` repetitions); the ratio is the
    median of the per-repetition ratios."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from wal_append_ratio import measure

    r = measure(reps, n, 100, directory)
    return {
        "wal_append_rec_s": r["wal_rec_s_median"],
        "struct_loop_rec_s": r["loop_rec_s_median"],
        "ratio": r["ratio_median"],
        "ratio_min": r["ratio_min"],
        "runs": r,
    }


def bench_run(url: str, *, topics: int, message_size: int, batch_size: int, seconds: float) -> dict:
    from danube.cli.bench import BenchConfig, run_bench

    config = BenchConfig(
        service_url=url,
        topics=topics,
        producers=topics,
        consumers=topics,
        message_size=message_size,
        batch_size=batch_size,
        duration=seconds,
        progress=False,
        sync="always",
        connections=2 * topics if topics > 1 else 0,
        max_batch_bytes=max(1 << 20, 4 * message_size),
    )
    result = asyncio.run(run_bench(config))
    return {
        "publish_rate": result.publish_rate,
        "publish_mb_s": result.publish_mb_s,
        "end_to_end_rate": result.end_to_end_rate,
        "errors": result.errors[:3],
    }


def ratios(url: str, directory: str, seconds: float) -> dict:
    out: dict = {}
    one = bench_run(url, topics=1, message_size=100, batch_size=1000, seconds=seconds)
    hundred = bench_run(url, topics=100, message_size=100, batch_size=1000, seconds=seconds)
    out["group_commit"] = {
        "one_topic": one,
        "hundred_topics": hundred,
        "ratio": hundred["publish_rate"] / max(one["publish_rate"], 1e-9),
    }
    disk = disk_dsync_bandwidth(directory)
    out["disk_dsync_mb_s"] = disk / 1e6
    for size, batch in ((1024, 256), (65536, 8)):
        r = bench_run(url, topics=1, message_size=size, batch_size=batch, seconds=seconds)
        out[f"large_{size}"] = {**r, "ratio_to_disk": r["publish_mb_s"] * 1e6 / disk}
    out["append"] = append_vs_struct_loop(directory)
    return out


# ------------------------------------------------------------------ main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--topics", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--idle-close", type=float, default=5.0, help="storage.wal.idle_close_seconds (default 5)")
    ap.add_argument("--skip-ratios", action="store_true")
    ap.add_argument("--ratio-seconds", type=float, default=5.0)
    ap.add_argument("--dir", default=None, help="parent of the broker's data directory (default: a temp dir)")
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--keep-dir", action="store_true", help="keep the broker's data directory and log")
    ap.add_argument("--broker-log-level", default="INFO")
    args = ap.parse_args()

    from danube.server.limits import raise_nofile_limit

    raise_nofile_limit()
    out: dict = {"topics": args.topics, "load_before": os.getloadavg()[0]}
    work = tempfile.mkdtemp(prefix="danube-scale-", dir=args.dir)
    data_dir = os.path.join(work, "data")
    os.makedirs(data_dir)
    wal_root = os.path.join(data_dir, "wal")
    broker = Broker(data_dir, args.idle_close, max_connections=4096, log_level=args.broker_log_level)
    try:
        broker.start()
        broker.wait_listening()
        asyncio.run(first_request(broker.url))  # warm: the topic 0 exists from here
        pid = broker.proc.pid
        before = snapshot(pid, wal_root)
        before_names = thread_names(pid)
        t0 = time.monotonic()
        offsets = asyncio.run(send_to_all(broker.url, args.topics, args.concurrency, PAYLOAD))
        out["create_s"] = time.monotonic() - t0
        out["create_bad_offsets"] = sum(1 for i, o in enumerate(offsets) if o != (1 if i == 0 else 0))
        active = snapshot(pid, wal_root)
        # wait for the idle close: every topic's WAL down to its lock file
        t_active = time.monotonic()
        deadline = t_active + args.idle_close * 4 + 30
        idle = snapshot(pid, wal_root)
        while time.monotonic() < deadline:
            time.sleep(max(args.idle_close / 2, 0.5))
            settled = not topics_holding_files(pid, wal_root)
            idle = snapshot(pid, wal_root)
            if settled:
                out["idle_settled_s"] = time.monotonic() - t_active
                break
        else:  # not settled: say what is still held, by which topics and threads
            out["idle_unsettled"] = {
                "topics_holding_files": topics_holding_files(pid, wal_root),
                "threads_by_name": thread_names(pid),
                "threads_before_by_name": before_names,
            }
        n = args.topics
        out["before"], out["active"], out["idle"] = before, active, idle
        out["per_topic_active"] = {k: (active[k] - before[k]) / n for k in before}
        out["per_topic_idle"] = {k: (idle[k] - before[k]) / n for k in before}
        out["data_bytes_per_topic"] = 64 + 46 + len(PAYLOAD)  # file header + frame header + payload (approx.)

        # crash and restart
        broker.kill()
        t_spawn = broker.start()
        asyncio.run(first_request(broker.url))
        out["restart_first_request_s"] = time.monotonic() - t_spawn
        t0 = time.monotonic()
        offsets = asyncio.run(send_to_all(broker.url, n, args.concurrency, b"second"))
        out["recover_all_s"] = time.monotonic() - t0
        # topic 0 also holds the two "first-request" messages (before the topics, after the restart)
        out["recover_bad_offsets"] = sum(1 for i, o in enumerate(offsets) if o != (3 if i == 0 else 1))
        out["restart_rss"] = rss(broker.proc.pid)
        if not args.skip_ratios:
            # let the topics just written go idle first: their closing is not the ratios' business
            deadline = time.monotonic() + args.idle_close * 4 + 30
            while time.monotonic() < deadline and descriptors(broker.proc.pid) > before["fds"] + 1.2 * n:
                time.sleep(0.5)
            out["ratios"] = ratios(broker.url, work, args.ratio_seconds)
        broker.stop()
        t0 = time.monotonic()
        problems = check_wals(wal_root, n)
        out["check_s"] = time.monotonic() - t0
        out["check_problems"] = problems[:20]
        out["check_problem_count"] = len(problems)
    finally:
        broker.stop()
        broker.log.close()
        out["load_after"] = os.getloadavg()[0]
        if args.keep_dir:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    report(out)
    path = args.json_out or os.path.join(HERE, "out", f"scale-{int(time.time())}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"JSON: {path}")
    return 0 if not out.get("check_problem_count") and not out.get("recover_bad_offsets") else 1


def report(out: dict) -> None:
    kib = 1024
    pa, pi = out["per_topic_active"], out["per_topic_idle"]
    print(
        f"{out['topics']} reliable topics, one 100 B message each (load {out['load_before']:.1f} -> "
        f"{out['load_after']:.1f})"
    )
    print(f"  created in {out['create_s']:.1f} s")
    print(
        f"  per topic, just written: disk {pa['disk'] / kib:.1f} KiB, RSS {pa['rss'] / kib:.1f} KiB, "
        f"descriptors {pa['fds']:.2f}, threads {pa['threads']:.2f}"
    )
    print(
        f"  per topic, idle-closed:  disk {pi['disk'] / kib:.1f} KiB, RSS {pi['rss'] / kib:.1f} KiB, "
        f"descriptors {pi['fds']:.2f}, threads {pi['threads']:.2f}"
    )
    print(
        f"  restart after SIGKILL: first request served in {out['restart_first_request_s']:.2f} s; "
        f"every topic written again in {out['recover_all_s']:.1f} s "
        f"({out['recover_bad_offsets']} wrong offsets); WAL check: {out['check_problem_count']} problems"
    )
    r = out.get("ratios")
    if r:
        g = r["group_commit"]
        print(
            f"  100 topics vs 1, sync=always: {g['hundred_topics']['publish_rate']:,.0f} vs "
            f"{g['one_topic']['publish_rate']:,.0f} msg/s = {g['ratio']:.2f}"
        )
        print(f"  disk fdatasync'd 64 KiB writes: {r['disk_dsync_mb_s']:.0f} MB/s")
        for size in (1024, 65536):
            x = r[f"large_{size}"]
            print(f"  {size} B end to end: {x['publish_mb_s']:.0f} MB/s = {x['ratio_to_disk']:.2f} of the disk")
        a = r["append"]
        print(
            f"  WAL append() {a['wal_append_rec_s']:,.0f} rec/s vs struct loop {a['struct_loop_rec_s']:,.0f} "
            f"= {a['ratio']:.2f}x (median of per-repetition ratios; min {a['ratio_min']:.2f})"
        )


if __name__ == "__main__":
    sys.exit(main())
