"""How busy the machine was while a benchmark ran: load average, CPU steal and CPU pressure.

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
class CpuTimes:
    total: int      # jiffies over all CPUs and states
    steal: int      # jiffies the hypervisor ran something else while we wanted the CPU
    pressure_us: int | None   # /proc/pressure/cpu "some" total: microseconds with a task waiting


def read_cpu_times() -> CpuTimes | None:
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    values = [int(v) for v in fields[1:]]
    steal = values[7] if len(values) > 7 else 0
    # guest time is already counted in user time
    total = sum(values[:8])
    return CpuTimes(total=total, steal=steal, pressure_us=_cpu_pressure_total())


def _cpu_pressure_total() -> int | None:
    try:
        with open("/proc/pressure/cpu") as f:
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


def summary(before: CpuTimes | None, after: CpuTimes | None, seconds: float,
            load_before: float | None, load_after: float | None) -> dict:
    """Steal as a share of all CPU time, CPU pressure as a share of wall time, load at both ends."""
    out: dict = {"load_before": load_before, "load_after": load_after, "steal_pct": None,
                 "cpu_pressure_pct": None}
    if before is None or after is None:
        return out
    elapsed = after.total - before.total
    if elapsed > 0:
        out["steal_pct"] = round(100.0 * (after.steal - before.steal) / elapsed, 1)
    if before.pressure_us is not None and after.pressure_us is not None and seconds > 0:
        out["cpu_pressure_pct"] = round((after.pressure_us - before.pressure_us) / (seconds * 1e4), 1)
    return out


def describe(state: dict) -> str:
    parts = []
    if state.get("load_before") is not None:
        parts.append(f"load average {state['load_before']} -> {state['load_after']}")
    if state.get("steal_pct") is not None:
        parts.append(f"CPU steal {state['steal_pct']}%")
    if state.get("cpu_pressure_pct") is not None:
        parts.append(f"CPU pressure (some) {state['cpu_pressure_pct']}% of the time")
    return "machine: " + (", ".join(parts) if parts else "not measurable here")


@contextlib.contextmanager
def observe() -> Iterator[dict]:
    """``with observe() as state:`` fills ``state`` (see ``summary``) when the block ends."""
    state: dict = {}
    started, load, cpu = time.monotonic(), load_average(), read_cpu_times()
    try:
        yield state
    finally:
        state.update(summary(cpu, read_cpu_times(), time.monotonic() - started, load, load_average()))
