"""What a scalable topic's controller acts through and answers with: the segment operations
(PIP-468's Segments admin API) it needs of the brokers, its two errors, the subscription kinds,
and the names of the steps a split, merge or prune goes through (for fault injection)."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Mapping, Protocol

from danube.errors import DanubeError

DEFAULT_GRACE_SECONDS = 30.0
STREAM = "stream"  # ordered consumers, assigned segments by the controller
QUEUE = "queue"  # unordered consumers attached to every segment

StepHook = Callable[[str], Awaitable[None]]
"""Awaited with the step's name as a split or merge (``STEPS``) or a prune (``PRUNE_STEP``)
passes each step: the place where a test makes the leader crash."""
STEPS = ("intent", "children_created", "terminate_marked", "parents_terminated", "layout_updated")
PRUNE_STEP = "pruned"  # a prune: the layout no longer has the segment, its topic is not deleted yet


def segment_sub_type(kind: str) -> str:
    """The ordinary subscription type a scalable subscription uses on each segment topic."""
    return "shared" if kind == QUEUE else "failover"


class NotLeaderError(DanubeError):
    """This broker's controller is not the topic's leader; ``leader_url`` is the one (may be empty)."""

    retriable = True

    def __init__(self, message: str, leader_url: str = "") -> None:
        super().__init__(message)
        self.leader_url = leader_url


class LayoutConflictError(DanubeError):
    """The layout changed under the operation (another leader, another operation in progress)."""

    retriable = True


class SegmentOps(Protocol):
    """Operations on segment topics (ordinary reliable topics), wherever they are owned.

    All are idempotent: creating an existing segment adds the missing subscriptions, terminating
    a terminated one or deleting a missing one succeeds."""

    async def create_segment(self, topic: str, subscriptions: Mapping[str, str]) -> None:
        """Create the segment topic with a cursor at Earliest for each subscription (name → type)."""

    async def terminate_segment(self, topic: str) -> None: ...

    async def delete_segment(self, topic: str) -> None: ...

    async def segment_subscriptions(self, topic: str) -> dict[str, str]:
        """The segment's subscriptions: name → subscription type."""

    async def create_subscription(self, topic: str, subscription: str, sub_type: str) -> None: ...

    async def delete_subscription(self, topic: str, subscription: str) -> None: ...

    async def backlog(self, topic: str, subscription: str) -> int: ...

    async def segment_stats(self, topic: str) -> dict[str, Any]: ...
