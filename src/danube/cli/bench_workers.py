"""`danube bench --client-processes N`: the run spread over N producer processes.

One Python process cannot make calls fast enough for many small batches on many topics: the bench
would measure itself.  Each producer process (a fresh interpreter, started like the consumer process)
gets a contiguous slice of the topics with the producers and consumers that go with them, its share of
the rate and of the connections, and its own consumer process.  The parent waits until every process
is set up, gives them one start time, measures the broker over the window, and merges what they return
(``bench_parts.merge``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
import time

from danube.cli import _machine
from danube.cli.bench_config import BenchConfig, BenchResult, split
from danube.cli.bench_parts import PartResult, merge, run_part
from danube.processes import cpu_seconds

_START_MARGIN_S = 0.05  # the start time handed out lies this far ahead, so every process sees it coming


class Window:
    """The measured window as the parent sees it: the broker's CPU, the parent's own, the machine's state."""

    def __init__(self, broker_pid: int | None) -> None:
        self.broker_pid = broker_pid
        self.machine: dict = {}
        self.broker_cpu_s: float | None = None
        self.own_cpu_s = 0.0
        self.wall_s = 0.0
        self.opened_at = 0.0  # time.monotonic() when the window opened
        self.broker_sending_cores: float | None = None  # the broker while calls were made

    def open(self) -> None:
        self._t0 = self.opened_at = time.monotonic()
        self._broker0 = cpu_seconds(self.broker_pid)
        self._own0 = cpu_seconds(os.getpid())
        self._load0, self._counters0 = _machine.load_average(), _machine.read_counters()

    def sent(self) -> None:
        """The calls stopped: the broker's cores while they were made."""
        wall = time.monotonic() - self._t0
        if self.broker_pid and wall > 0:
            self.broker_sending_cores = (cpu_seconds(self.broker_pid) - self._broker0) / wall

    def close(self) -> None:
        self.wall_s = time.monotonic() - self._t0
        if self.broker_pid:
            self.broker_cpu_s = cpu_seconds(self.broker_pid) - self._broker0
        self.own_cpu_s = cpu_seconds(os.getpid()) - self._own0
        self.machine = _machine.summary(
            self._counters0, _machine.read_counters(), self.wall_s, self._load0, _machine.load_average()
        )


def plan(config: BenchConfig) -> list[BenchConfig]:
    """The share of each producer process: a contiguous slice of the topics, the producers and consumers
    that the one-process run puts on those topics (round-robin), the rate of those producers, and the
    connections of each side split in proportion."""
    n, topics = config.client_processes, config.topics
    sizes = split(topics, [1] * n)
    owner = [j for j, size in enumerate(sizes) for _ in range(size)]
    producers, consumers = [0] * n, [0] * n
    for i in range(config.producers):
        producers[owner[i % topics]] += 1
    for i in range(config.consumers):
        consumers[owner[i % topics]] += 1
    if config.connections > 0:
        total = config.producers + config.consumers
        producer_side = max(1, min(config.producers, round(config.connections * config.producers / total)))
        consumer_side = max(1, min(config.consumers, round(config.connections * config.consumers / total)))
        connections = [
            p + c for p, c in zip(split(producer_side, producers), split(consumer_side, consumers), strict=True)
        ]
    else:
        connections = [0] * n
    shares = []
    first = 0
    for j in range(n):
        shares.append(
            dataclasses.replace(
                config,
                topics=sizes[j],
                first_topic=first,
                producers=producers[j],
                consumers=consumers[j],
                rate=config.rate * producers[j] / config.producers if config.rate > 0 else 0.0,
                connections=connections[j],
                client_processes=1,
                progress=False,
            )
        )
        first += sizes[j]
    return shares


class _Stopped(Exception):
    """The parent called the run off before the start (another producer process failed to set up)."""


class _PipeGate:
    def __init__(self, conn) -> None:
        self._conn = conn

    async def ready(self) -> float:
        self._conn.send("ready")
        answer = await asyncio.to_thread(self._conn.recv)
        if answer == "stop":
            raise _Stopped
        return float(answer[1])

    def sent(self) -> None:
        self._conn.send("sent")

    def drained(self) -> None:
        self._conn.send("drained")


def worker_main(conn_fd: int) -> None:
    """Entry point of a producer process: set up, say "ready", start when told, say "drained", answer."""
    from multiprocessing.connection import Connection

    from danube import _allocator

    _allocator.tune()  # like every danube command's process (started with -c, not through main)
    conn = Connection(conn_fd)
    config, topic, sub_type = conn.recv()
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        factory = None
    answer: object
    with asyncio.Runner(loop_factory=factory) as runner:
        try:
            answer = runner.run(run_part(config, topic, sub_type, _PipeGate(conn)))
        except _Stopped:
            answer = {"error": "stopped"}
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which owns the outcome
            answer = {"error": f"producer process: {exc!r}"}
    conn.send(answer)
    conn.close()


class _Worker:
    def __init__(self, share: BenchConfig, topic: str, sub_type: str) -> None:
        from multiprocessing.connection import Connection

        ours, theirs = socket.socketpair()
        fd = theirs.fileno()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"from danube.cli.bench_workers import worker_main; worker_main({fd})"],
            pass_fds=(fd,),
        )
        theirs.close()
        self.conn = Connection(ours.detach())
        self.conn.send((share, topic, sub_type))

    async def receive(self, timeout: float, what: str):
        if not await asyncio.to_thread(self.conn.poll, timeout):
            raise RuntimeError(f"a producer process did not {what} within {timeout:.0f}s")
        try:
            return self.conn.recv()
        except EOFError:
            raise RuntimeError(f"a producer process exited with code {self.proc.wait()}") from None

    def stop(self) -> None:
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.conn.close()


def _errors(answers: list, expected) -> list[str]:
    out = []
    for answer in answers:
        if isinstance(answer, BaseException):
            out.append(str(answer))
        elif isinstance(answer, dict) and "error" in answer:
            out.append(answer["error"])
        elif not expected(answer):
            out.append(f"a producer process answered {answer!r:.80}")
    return out


async def run_split(config: BenchConfig, topic: str, sub_type: str, result: BenchResult, window: Window) -> None:
    """The run over ``config.client_processes`` producer processes; fills ``result`` and ``window``."""
    shares = plan(config)
    workers = [_Worker(share, topic, sub_type) for share in shares]
    try:
        # subscribing and creating take a metadata write each: allow for a thousand topics on a busy machine
        setup_s = max(60.0, 0.6 * (config.producers + config.consumers) / len(workers) + 30)
        answers = await asyncio.gather(*(w.receive(setup_s, "set up") for w in workers), return_exceptions=True)
        errors = _errors(answers, lambda a: a == "ready")
        if errors:
            for w, answer in zip(workers, answers, strict=True):
                if answer == "ready":
                    w.conn.send("stop")
            result.errors.extend(errors)
            return
        window.open()
        start_at = time.perf_counter() + _START_MARGIN_S
        for w in workers:
            w.conn.send(("go", start_at))
        answers = await asyncio.gather(
            *(w.receive(config.duration + 60, "make its calls") for w in workers), return_exceptions=True
        )
        window.sent()
        sent = [w for w, a in zip(workers, answers, strict=True) if a == "sent"]
        result.errors.extend(_errors(answers, lambda a: a == "sent"))
        run_s = config.drain_timeout + 60
        answers = await asyncio.gather(*(w.receive(run_s, "finish") for w in sent), return_exceptions=True)
        window.close()
        drained = [w for w, a in zip(sent, answers, strict=True) if a == "drained"]
        result.errors.extend(_errors(answers, lambda a: a == "drained"))
        answers = await asyncio.gather(*(w.receive(60, "answer") for w in drained), return_exceptions=True)
        parts = [a for a in answers if isinstance(a, PartResult)]
        result.errors.extend(_errors([a for a in answers if not isinstance(a, PartResult)], lambda a: False))
        if parts:
            merge(parts, config, result, coordinator_cpu_s=window.own_cpu_s)
        if len(parts) < len(workers):
            result.errors.append(f"only {len(parts)} of {len(workers)} producer processes returned a result")
    finally:
        for w in workers:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(w.stop)
