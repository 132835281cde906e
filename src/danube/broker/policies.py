"""Topic policies, subscription failure policies and dispatch settings.

Names and defaults follow Danube (0 = unlimited).  Each is a section of the broker's
config file loaded by ``danube.settings.load_section`` (``from_dict``): Danube's YAML
keys, and an unknown key or a bad value is an error naming it, so a typo in a config
file is never silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from danube.settings import ConfigError, check_settings, load_section, setting

MiB = 1024 * 1024
POISON_POLICIES = ("block", "drop", "dead_letter")
BACKOFF_STRATEGIES = ("fixed", "exponential")


@dataclass(frozen=True)
class TopicPolicies:
    """Limits per topic; 0 means unlimited (Danube's convention)."""

    max_producers_per_topic: int = setting(0, minimum=0)
    max_subscriptions_per_topic: int = setting(0, minimum=0)
    max_consumers_per_topic: int = setting(0, minimum=0)
    max_consumers_per_subscription: int = setting(0, minimum=0)
    max_publish_rate: int = setting(0, minimum=0)  # messages per second per topic
    max_subscription_dispatch_rate: int = setting(0, minimum=0)  # messages per second per subscription
    max_message_size: int = setting(10 * MiB, minimum=0)

    def __post_init__(self) -> None:
        check_settings(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, path: str = "policies") -> "TopicPolicies":
        return load_section(cls, data, path)

    def to_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _snake(name: str) -> str:
    """``DeadLetter`` / ``dead-letter`` / ``dead_letter`` → ``dead_letter``."""
    out: list[str] = []
    for i, ch in enumerate(name.strip()):
        if ch.isupper() and i and out[-1] != "_":
            out.append("_")
        out.append("_" if ch == "-" else ch.lower())
    return "".join(out)


@dataclass(frozen=True)
class FailurePolicy:
    """What happens to a message that is not acked (Danube's subscription failure policy).

    As in Danube, ``max_redelivery_count`` is how many times a message is delivered again
    after its first delivery fails: 0 means the first nack or ack timeout already applies the
    poison policy."""

    max_redelivery_count: int = setting(5, minimum=0)
    ack_timeout_ms: int = setting(30_000, minimum=0)
    base_redelivery_delay_ms: int = setting(1_000, minimum=0)
    max_redelivery_delay_ms: int = setting(60_000, minimum=0)
    poison_policy: str = setting("block", choices=POISON_POLICIES)
    dead_letter_topic: str = ""
    backoff_strategy: str = setting("exponential", choices=BACKOFF_STRATEGIES)

    def __post_init__(self) -> None:
        check_settings(self)
        if self.poison_policy == "dead_letter" and not self.dead_letter_topic.strip():
            raise ConfigError("dead_letter_topic", "poison_policy dead_letter needs a dead_letter_topic")

    @classmethod
    def prepare_section(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """Danube's spellings too: "DeadLetter", "Exponential", a null dead-letter topic."""
        data = dict(data)
        for name in ("poison_policy", "backoff_strategy"):
            if isinstance(data.get(name), str):
                data[name] = _snake(data[name])
        if "dead_letter_topic" in data and data["dead_letter_topic"] is None:
            data["dead_letter_topic"] = ""
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, path: str = "failure_policy") -> "FailurePolicy":
        return load_section(cls, data, path)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def backoff_ms(self, attempt: int) -> int:
        """Redelivery delay of the ``attempt``-th redelivery: the base (fixed) or
        base × 2^(attempt−1) (exponential), capped at the maximum."""
        if attempt < 1:
            attempt = 1
        if self.backoff_strategy == "fixed":
            delay = self.base_redelivery_delay_ms
        else:
            delay = self.base_redelivery_delay_ms * (1 << min(attempt - 1, 40))
        return min(delay, self.max_redelivery_delay_ms)

    def nack_delay_ms(self, attempt: int, requested_ms: int | None) -> int:
        """A Nack waits max(policy backoff, requested), capped at the maximum delay."""
        delay = self.backoff_ms(attempt)
        if requested_ms is not None and requested_ms > delay:
            delay = requested_ms
        return min(delay, self.max_redelivery_delay_ms)

    def with_overrides(self, **kw: Any) -> "FailurePolicy":
        return replace(self, **kw)


@dataclass(frozen=True)
class DispatchSettings:
    """Broker-wide dispatch knobs.

    ``max_unacked_messages`` is the per-subscription window of delivered but
    unacked messages.  Danube's default is 10, which caps throughput at a few
    thousand messages per second per subscription; batches of frames need a
    deeper window, so the default here is larger (set 10 to match Danube).
    """

    max_unacked_messages: int = setting(10_000, minimum=1)
    max_batch_messages: int = setting(1_000, minimum=0)  # per delivery on the batch path
    max_batch_bytes: int = setting(4 * MiB, minimum=0)
    non_reliable_buffer_bytes: int = setting(16 * MiB, minimum=0)  # in-memory history per non-reliable topic
    cursor_flush_interval_ms: int = setting(1_000, minimum=0, maximum=5_000)  # debounce of cursor persistence
    consumer_grace_ms: int = setting(0, minimum=0)  # how long a detached consumer keeps its slot

    def __post_init__(self) -> None:
        check_settings(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, path: str = "dispatch") -> "DispatchSettings":
        return load_section(cls, data, path)
