"""How busy the machine was while a benchmark ran: load average, CPU steal, CPU and I/O pressure.

Tails measured on a shared 2-core virtual machine move with load nobody in the run can see;
``danube bench`` and the peer table (bench/peers/run.py) print these next to their figures so a
reader can tell a quiet run from a noisy one.
Linux only (``/proc``); on other systems every field is None.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Iterator


@dataclass
class MachineCounters:
    total: int  # jiffies over all CPUs and states
    steal: int  # jiffies the hypervisor ran something else while we wanted the CPU
    cpu_pressure_us: int | None  # /proc/pressure/cpu "some" total: microseconds with a task waiting
    # /proc/pressure/io "some" total: microseconds with a task waiting on the disk.  Under
    # sync=always a run waits on fdatasync all along, so this reads "how slow was the disk",
    # the other outside cause of a tail besides steal.
    io_pressure_us: int | None = None


def read_counters() -> MachineCounters | None:
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    values = [int(v) for v in fields[1:]]
    steal = values[7] if len(values) > 7 else 0
    # guest time is already counted in user time
    total = sum(values[:8])
    return MachineCounters(
        total=total, steal=steal, cpu_pressure_us=_pressure_total("cpu"), io_pressure_us=_pressure_total("io")
    )


def _pressure_total(resource: str) -> int | None:
    try:
        with open(f"/proc/pressure/{resource}") as f:
            for line in f:
                if line.startswith("some "):
                    return int(line.split("total=")[1])
    except (OSError, IndexError, ValueError):
        return None
    return None


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def summary(
    before: MachineCounters | None,
    after: MachineCounters | None,
    seconds: float,
    load_before: float | None,
    load_after: float | None,
) -> dict:
    """Steal as a share of all CPU time, CPU and I/O pressure as shares of wall time, load at both ends."""
    out: dict = {
        "load_before": load_before,
        "load_after": load_after,
        "steal_pct": None,
        "cpu_pressure_pct": None,
        "io_pressure_pct": None,
    }
    if before is None or after is None:
        return out
    elapsed = after.total - before.total
    if elapsed > 0:
        out["steal_pct"] = round(100.0 * (after.steal - before.steal) / elapsed, 1)
    out["cpu_pressure_pct"] = _share_of_wall(before.cpu_pressure_us, after.cpu_pressure_us, seconds)
    out["io_pressure_pct"] = _share_of_wall(before.io_pressure_us, after.io_pressure_us, seconds)
    return out


def _share_of_wall(before_us: int | None, after_us: int | None, seconds: float) -> float | None:
    if before_us is None or after_us is None or seconds <= 0:
        return None
    return round((after_us - before_us) / (seconds * 1e4), 1)


def describe(state: dict) -> str:
    parts = []
    if state.get("load_before") is not None:
        parts.append(f"load average {state['load_before']} -> {state['load_after']}")
    if state.get("steal_pct") is not None:
        parts.append(f"CPU steal {state['steal_pct']}%")
    if state.get("cpu_pressure_pct") is not None:
        parts.append(f"CPU pressure (some) {state['cpu_pressure_pct']}% of the time")
    if state.get("io_pressure_pct") is not None:
        parts.append(f"I/O pressure (some) {state['io_pressure_pct']}%")
    return "machine: " + (", ".join(parts) if parts else "not measurable here")


@contextlib.contextmanager
def observe() -> Iterator[dict]:
    """``with observe() as state:`` fills ``state`` (see ``summary``) when the block ends."""
    state: dict = {}
    started, load, counters = time.monotonic(), load_average(), read_counters()
    try:
        yield state
    finally:
        state.update(summary(counters, read_counters(), time.monotonic() - started, load, load_average()))
