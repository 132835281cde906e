"""The cluster leader: the project's one election (``danube.metadata.election``) on ``/cluster/leader``.

Each broker campaigns with its id under its membership lease; the leader runs the load manager
and the rebalancer, and every write it makes as leader carries :meth:`LeaderElection.guard`.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from danube.metadata import keys
from danube.metadata.election import Election, LeaseHolder
from danube.metadata.store import MetadataStore


class LeaderElection(Election):
    """The election of the cluster leader, as broker ``broker_id`` takes part in it."""

    def __init__(
        self,
        store: MetadataStore,
        broker_id: str,
        membership: LeaseHolder,
        *,
        on_elected: Callable[[], Awaitable[None]] | None = None,
        on_deposed: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(
            store,
            keys.leader(),
            broker_id,
            membership,
            what="the cluster",
            on_elected=on_elected,
            on_deposed=on_deposed,
        )

    @property
    def broker_id(self) -> str:
        return self.candidate

    @property
    def membership(self) -> LeaseHolder:
        return self.lease

    @property
    def leader_id(self) -> str | None:
        """The leader's broker id; None while there is none."""
        return self.leader or None
