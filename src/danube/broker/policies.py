"""Topic policies, subscription failure policies and dispatch settings.

Names and defaults follow Danube (0 = unlimited).  Each ``from_dict`` accepts
Danube's YAML keys and rejects unknown ones with a clear error, so a typo in a
config file is never silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from danube.errors import InvalidArgumentError

MiB = 1024 * 1024
POISON_POLICIES = ("block", "drop", "dead_letter")
BACKOFF_STRATEGIES = ("fixed", "exponential")


def _from_mapping(cls, data: Mapping[str, Any] | None, what: str):
    if not data:
        return cls()
    if not isinstance(data, Mapping):
        raise InvalidArgumentError(f"{what} must be a mapping, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise InvalidArgumentError(f"unknown {what} keys: {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    values: dict[str, Any] = {}
    for name, value in data.items():
        default = getattr(cls(), name)
        if isinstance(default, bool):
            values[name] = bool(value)
        elif isinstance(default, int) and not isinstance(value, bool):
            try:
                values[name] = int(value)
            except (TypeError, ValueError):
                raise InvalidArgumentError(f"{what}.{name} must be an integer, got {value!r}") from None
            if values[name] < 0:
                raise InvalidArgumentError(f"{what}.{name} must be >= 0, got {value!r}")
        else:
            values[name] = value
    return cls(**values)


@dataclass(frozen=True)
class TopicPolicies:
    """Limits per topic; 0 means unlimited (Danube's convention)."""

    max_producers_per_topic: int = 0
    max_subscriptions_per_topic: int = 0
    max_consumers_per_topic: int = 0
    max_consumers_per_subscription: int = 0
    max_publish_rate: int = 0  # messages per second per topic
    max_subscription_dispatch_rate: int = 0  # messages per second per subscription
    max_message_size: int = 10 * MiB

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "TopicPolicies":
        return _from_mapping(cls, data, "policies")

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

    max_redelivery_count: int = 5
    ack_timeout_ms: int = 30_000
    base_redelivery_delay_ms: int = 1_000
    max_redelivery_delay_ms: int = 60_000
    poison_policy: str = "block"  # block | drop | dead_letter
    dead_letter_topic: str = ""
    backoff_strategy: str = "exponential"  # fixed | exponential

    def __post_init__(self) -> None:
        if self.poison_policy not in POISON_POLICIES:
            raise InvalidArgumentError(
                f"poison_policy must be one of {', '.join(POISON_POLICIES)}, got {self.poison_policy!r}"
            )
        if self.poison_policy == "dead_letter" and not self.dead_letter_topic.strip():
            raise InvalidArgumentError("poison_policy dead_letter needs dead_letter_topic")
        if self.backoff_strategy not in BACKOFF_STRATEGIES:
            raise InvalidArgumentError(
                f"backoff_strategy must be one of {', '.join(BACKOFF_STRATEGIES)}, got {self.backoff_strategy!r}"
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "FailurePolicy":
        if isinstance(data, Mapping):
            # Danube's spellings too: "DeadLetter", "Exponential", a null dead-letter topic
            data = dict(data)
            for name in ("poison_policy", "backoff_strategy"):
                if isinstance(data.get(name), str):
                    data[name] = _snake(data[name])
            if data.get("dead_letter_topic", "") is None:
                data["dead_letter_topic"] = ""
        return _from_mapping(cls, data, "failure_policy")

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

    max_unacked_messages: int = 10_000
    max_batch_messages: int = 1_000  # per delivery on the batch path
    max_batch_bytes: int = 4 * MiB
    non_reliable_buffer_bytes: int = 16 * MiB  # in-memory history per non-reliable topic
    cursor_flush_interval_ms: int = 1_000  # debounce of cursor persistence (<= 5 s)
    consumer_grace_ms: int = 0  # how long a detached consumer keeps its slot

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "DispatchSettings":
        settings = _from_mapping(cls, data, "dispatch")
        if settings.max_unacked_messages < 1:
            raise InvalidArgumentError("dispatch.max_unacked_messages must be >= 1")
        if settings.cursor_flush_interval_ms > 5_000:
            raise InvalidArgumentError("dispatch.cursor_flush_interval_ms must be <= 5000")
        return settings
