"""Producer and consumer registrations: the ids the broker hands out and the names it accepts.

A registration (a producer or consumer name with its id, on a topic) is kept in the metadata store,
so after a restart a client that kept its id simply continues (``BrokerService`` re-attaches it).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from danube.metadata import keys


@dataclass(frozen=True)
class Registration:
    kind: str  # "producer" | "consumer"
    id: int
    topic: str
    name: str
    info: dict


def new_id() -> int:
    # Random ids stay unique across restarts without a counter in the metadata store.
    return secrets.randbits(52) or 1


def check_name(what: str, name: str) -> str:
    # The project's one name rule (danube.metadata.keys): the name becomes a metadata key segment.
    return keys.check_name(what, name)
