"""The simulator's scenarios: the use cases of Danube's load manager page, as cluster set-ups and timed events.

``add-brokers``, ``broker-failure`` and ``workload-drift`` (``danube.cluster.simulator`` describes
them and runs them on a :class:`~danube.cluster.simulator_cluster.SimCluster`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from danube.cluster.simulator_cluster import SimCluster, SimTopic
from danube.metadata import keys

SCENARIOS = ("add-brokers", "broker-failure", "workload-drift")


@dataclass
class Scenario:
    name: str
    description: str
    aggressiveness: str
    hours: float
    setup: Callable[[SimCluster], Awaitable[None]]
    events: list[tuple[float, Callable[[SimCluster], Awaitable[None]]]] = field(default_factory=list)
    settle_after_s: float = 0.0  # convergence is measured after this and after the last event


def _topic(rng: random.Random, name: str, created_at: float, *, scale: float = 1.0) -> SimTopic:
    return SimTopic(
        name,
        created_at,
        mbps=scale * rng.lognormvariate(math.log(0.25), 0.8),
        producers=1,
        consumers=rng.choice((1, 1, 2, 3)),
        backlog=rng.randrange(0, 5000),
    )


async def _populate(cluster: SimCluster, brokers: int, per_broker: int, *, scale: float = 1.0) -> None:
    born = cluster.clock.now() - 86400.0
    for i in range(1, brokers + 1):
        await cluster.add_broker(f"broker-{i}")
    for i in range(1, brokers + 1):
        for j in range(per_broker):
            await cluster.create_topic(_topic(cluster.rng, f"/default/b{i}-t{j:03d}", born, scale=scale), f"broker-{i}")
    await cluster.store.put(keys.unassigned("/system/load_reports"), b"null")
    cluster.topics["/system/load_reports"] = SimTopic("/system/load_reports", born, 0.05, 5, 1, 0)
    await cluster.assign_pending()


def scenario(name: str) -> Scenario:
    if name == "add-brokers":

        async def setup(c: SimCluster) -> None:
            await _populate(c, 3, 100)

        async def join(c: SimCluster) -> None:
            await c.add_broker("broker-4")
            await c.add_broker("broker-5")

        return Scenario(
            name,
            "3 brokers with 100 topics each; 2 brokers join after a minute",
            "aggressive",
            12.0,
            setup,
            [(60.0, join)],
        )
    if name == "broker-failure":

        async def setup(c: SimCluster) -> None:
            await _populate(c, 4, 150)

        def fail(b: str):
            async def run(c: SimCluster) -> None:
                await c.fail_broker(b)

            return run

        async def back(c: SimCluster) -> None:
            await c.add_broker("broker-1")

        async def hand_over(c: SimCluster) -> None:  # broker-2 restarts: broker-3 leads, broker-2 rejoins
            c.brokers.remove("broker-2")
            c.brokers.append("broker-2")
            c.events.append((c.clock.now(), "broker-2 restarts"))

        return Scenario(
            name,
            "4 brokers × 150 topics; the leader (broker-1) fails at 0:30 and its topics fail "
            "over; it returns empty at 1:00; at 1:30, mid-rebalancing, the next leader "
            "(broker-2) restarts and broker-3 takes over",
            "balanced",
            10.0,
            setup,
            [(1800.0, fail("broker-1")), (3600.0, back), (5400.0, hand_over)],
        )
    if name == "workload-drift":

        async def setup(c: SimCluster) -> None:
            await _populate(c, 4, 60, scale=0.2)
            start = c.clock.now()
            ramp_from, ramp_to = start + 2 * 3600.0, start + 5 * 3600.0

            def growth(now: float) -> float:  # ×1 in the morning, ×50 from 5:00, linear in between
                f = min(1.0, max(0.0, (now - ramp_from) / (ramp_to - ramp_from)))
                return 1.0 + 49.0 * f

            hot = [n for n in sorted(c.topics) if n.startswith(("/default/b1-", "/default/b2-"))]
            hot = [n for n in hot if c.rng.random() < 0.6]
            hot += [n for n in sorted(c.topics) if n.startswith("/default/b3-") and c.rng.random() < 0.05]
            for n in hot:
                c.topics[n].growth = growth

        return Scenario(
            name,
            "4 brokers × 60 quiet topics; from 2:00 to 5:00 a third of them (mostly on "
            "broker-1 and broker-2) grow fiftyfold",
            "balanced",
            12.0,
            setup,
            settle_after_s=5 * 3600.0,
        )
    raise ValueError(f"unknown scenario {name!r}; expected one of {', '.join(SCENARIOS)}")
