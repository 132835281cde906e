"""`danube bench`: the CPU its own client processes use, how busy the machine was, and who set the limit.

On a small machine the bench's producers and consumers are Python processes competing with the broker
for the same cores; a run that did not offer its rate says nothing about the broker unless it also says
how busy the client was.  Linux only (``/proc``); elsewhere every figure is 0 and no verdict is drawn.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

from danube.processes import cpu_seconds

# A process at this share of one core cannot go faster: it is the limit.
CLIENT_BOUND_CORE = 0.90
# The machine's CPUs this busy (all cores together): every process waited for a core.
MACHINE_SATURATED_PCT = 90.0
# Below this share of the offered rate the run did not offer (or deliver) its load.
SHORT_OF_OFFERED = 0.95


def children(pid: int) -> list[int]:
    """The direct child processes of ``pid`` (from every thread's ``children`` list)."""
    out: list[int] = []
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(path) as f:
                out.extend(int(p) for p in f.read().split())
        except (OSError, ValueError):
            continue
    return out


def descendants(pid: int, exclude: int | None = None) -> list[int]:
    """Every process below ``pid``, without ``exclude`` and what is below it (a broker the bench spawned)."""
    out: list[int] = []
    todo = children(pid)
    while todo:
        child = todo.pop()
        if child == exclude or child in out:
            continue
        out.append(child)
        todo.extend(children(child))
    return out


def machine_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot; idle and iowait are not busy."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    total = sum(values[:8])  # guest time is already counted in user time
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return total - idle, total


@dataclass
class CpuMark:
    """CPU seconds of a process and of each of its child processes, and the machine's jiffies, at one moment."""

    own: float
    others: dict[int, float]
    machine: tuple[int, int] | None


def mark(exclude: int | None = None) -> CpuMark:
    me = os.getpid()
    return CpuMark(cpu_seconds(me), {pid: cpu_seconds(pid) for pid in descendants(me, exclude)}, machine_jiffies())


@dataclass
class CpuSpan:
    """What this process (a producer process) and its children (its consumer process) used between two marks."""

    own_s: float = 0.0
    children_s: float = 0.0
    children_core_max: float = 0.0  # the busiest child's CPU seconds per wall second
    wall_s: float = 0.0

    @property
    def own_core(self) -> float:
        return self.own_s / self.wall_s if self.wall_s > 0 else 0.0


def span(start: CpuMark, end: CpuMark, wall_s: float) -> CpuSpan:
    """A child that started after ``start`` counts from zero; one gone by ``end`` no longer counts."""
    used = {pid: max(0.0, cpu - start.others.get(pid, 0.0)) for pid, cpu in end.others.items()}
    return CpuSpan(
        own_s=max(0.0, end.own - start.own),
        children_s=sum(used.values()),
        children_core_max=max(used.values(), default=0.0) / wall_s if wall_s > 0 else 0.0,
        wall_s=wall_s,
    )


def machine_busy_pct(start: CpuMark, end: CpuMark) -> float | None:
    """Busy share of all the machine's CPUs between two marks (100 = every core busy)."""
    if start.machine is None or end.machine is None:
        return None
    busy, total = end.machine[0] - start.machine[0], end.machine[1] - start.machine[1]
    return round(100.0 * busy / total, 1) if total > 0 else None


def verdict(
    *,
    offered_rate: float,
    sent_rate: float,
    delivered_rate: float,
    producer_core: float,
    consumer_core: float,
    machine_busy: float | None,
    client_cores: float,
    broker_cores: float | None,
    cores: int | None = None,
) -> tuple[str | None, str]:
    """(what limited the run, one plain sentence).  "client": a bench process was CPU-bound, or the
    machine's CPUs were saturated with the bench client using at least as much of them as every other
    process (the broker aside); "machine": saturated by other processes; "broker": the load was not
    offered or delivered with neither; None: the run did what it was asked (as fast as possible: no
    process was CPU-bound).  ``cores`` is the machine's CPU count (``os.cpu_count()`` when None)."""
    cores = cores or os.cpu_count() or 1
    used = f"the bench client used {client_cores:.2f} cores" + (
        f", the broker {broker_cores:.2f}" if broker_cores is not None else ""
    )
    saturated = ""
    if machine_busy is not None and machine_busy >= MACHINE_SATURATED_PCT:
        others = machine_busy / 100 * cores - client_cores - (broker_cores or 0.0)
        busy = (
            f"the machine's {cores} CPUs were {machine_busy:.0f}% busy ({used}, other processes {max(0.0, others):.2f})"
        )
        saturated = "client" if client_cores >= others else "machine"

    def blame_saturation(short: str) -> tuple[str, str]:
        if saturated == "client":
            return "client", f"the client was a limit: {short} while {busy}; these are not the broker's limits"
        return "machine", f"the machine was the limit: {short} while {busy}; measure again on a quieter machine"

    if offered_rate > 0 and sent_rate < SHORT_OF_OFFERED * offered_rate:
        short = f"the bench made calls for {sent_rate:,.0f} of the {offered_rate:,.0f} msg/s offered"
        if producer_core >= CLIENT_BOUND_CORE:
            return "client", (
                f"the client was the limit: {short} while its busiest producer process used "
                f"{producer_core:.0%} of a core ({used}); try --client-processes"
            )
        if saturated:
            return blame_saturation(short)
        return "broker", (
            f"{short} without being CPU-bound (busiest producer process at {producer_core:.0%} of a core): "
            "the producers waited for the broker's acks (their in-flight window was full)"
        )
    if offered_rate > 0 and delivered_rate < SHORT_OF_OFFERED * offered_rate:
        short = f"{delivered_rate:,.0f} of the {offered_rate:,.0f} msg/s offered were delivered"
        if consumer_core >= CLIENT_BOUND_CORE:
            return "client", (
                f"the client was the limit: {short} while the busiest consumer process used {consumer_core:.0%} of a core"
            )
        if saturated:
            return blame_saturation(short)
        return "broker", (
            f"the broker was the limit: {short}, with every call made on time and no bench process "
            f"CPU-bound (busiest consumer process at {consumer_core:.0%} of a core)"
        )
    if offered_rate <= 0 and max(producer_core, consumer_core) >= CLIENT_BOUND_CORE:
        which = "producer" if producer_core >= consumer_core else "consumer"
        return "client", (
            f"as fast as possible, the busiest {which} process used {max(producer_core, consumer_core):.0%} of a "
            "core: the rate shown may be the client's limit, not the broker's; try --client-processes"
        )
    return None, ""
