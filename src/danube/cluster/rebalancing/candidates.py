"""Which topics may move, and where to.

A topic is a candidate when it is not blacklisted (exact name or a prefix
ending in ``*``), was not moved within ``cooldown_seconds`` and is at least
``min_topic_age_seconds`` old; candidates of one broker are ordered lightest
first by the topic load score (``scoring.topic_load_score``: 0.5·MB/s +
0.3·connections + 0.2·backlog/10000).  A move's target must be an active broker
other than the source that the topic did not leave within the last hour
(anti-oscillation); Danube's target is the least loaded such broker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

from danube.cluster.scoring import is_blacklisted, rank

from . import history as _history
from .balance import ClusterState, TopicInfo
from .config import RebalancingConfig


@dataclass(frozen=True)
class Eligibility:
    blacklist: tuple = ()
    cooling: frozenset = frozenset()  # moved within the cooldown
    young: frozenset = frozenset()  # younger than min_topic_age_seconds
    forbidden: Mapping[str, frozenset] = field(default_factory=dict)  # topic → brokers it may not go back to

    def topic_ok(self, topic: str) -> bool:
        return topic not in self.cooling and topic not in self.young and not is_blacklisted(topic, self.blacklist)

    def move_ok(self, topic: str, target: str) -> bool:
        return target not in self.forbidden.get(topic, ())

    def why_not(self, topic: str) -> str | None:
        if is_blacklisted(topic, self.blacklist):
            return "blacklisted"
        if topic in self.cooling:
            return "cooldown"
        if topic in self.young:
            return "too young"
        return None


def eligibility(
    config: RebalancingConfig,
    records: Sequence[_history.MoveRecord],
    now: float,
    topics: Iterable[str] = (),
    created_at: Callable[[str], float | None] | Mapping[str, float] | None = None,
) -> Eligibility:
    """The rules for one cycle at ``now``; ``created_at`` gives a topic's creation (or first-seen) time,
    None when unknown (then the topic counts as young)."""
    lookup: Callable[[str], float | None]
    if isinstance(created_at, Mapping):
        lookup = created_at.get
    else:
        lookup = created_at or (lambda _t: None)
    young = set()
    if config.min_topic_age_seconds > 0:
        for topic in topics:
            born = lookup(topic)
            if born is None or now - born < config.min_topic_age_seconds:
                young.add(topic)
    forbidden = {t: frozenset(b) for t, b in _history.forbidden_returns(records, now).items()}
    return Eligibility(
        tuple(config.blacklist_topics),
        frozenset(_history.recently_moved(records, now, config.cooldown_seconds)),
        frozenset(young),
        forbidden,
    )


def candidates(state: ClusterState, broker: str, rules: Eligibility) -> list[TopicInfo]:
    """``broker``'s movable topics, lightest first (ties by name)."""
    return sorted(
        (t for t in state.topics.get(broker, {}).values() if rules.topic_ok(t.name)),
        key=lambda t: (t.move_score, t.name),
    )


def target_for(loads: Mapping[str, float], source: str, topic: str, rules: Eligibility) -> str | None:
    """The least loaded active broker other than ``source`` the topic may go to (None: no target)."""
    for broker, _load in rank(loads):
        if broker != source and rules.move_ok(topic, broker):
            return broker
    return None
