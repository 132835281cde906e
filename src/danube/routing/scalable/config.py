"""The broker's ``scalable_topics:`` section (docs/scalable-topics.md)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Mapping

from danube.errors import InvalidArgumentError
from danube.routing.scalable.contracts import StepHook


@dataclass(frozen=True)
class ScalableTopicsConfig:
    enabled: bool = True  # PIP-468's scalableTopicEnabled
    session_grace_seconds: float = 30.0  # a disconnected ordered consumer keeps its segments this long
    controller_lease_seconds: int = 10  # standalone broker: TTL of the controller election lease
    auto_split_rate: float = 0.0  # msgs/s of one active segment that makes its leader split it; 0 = off
    auto_split_interval_seconds: float = 10.0
    max_segments: int = 64  # automatic splits stop at this many active segments
    prune_interval_seconds: float = 30.0  # how often the leader looks for sealed segments to prune; 0 = never
    sealed_retention_seconds: float = 3600.0  # a drained sealed segment is kept this long before it is pruned
    # debugging: "package.module:function", an async function awaited with the name of each step a
    # split, merge or prune passes (contracts.STEPS, PRUNE_STEP): where fault-injection tests make a
    # broker process die; empty (the default) in normal operation
    step_hook: str = ""

    def __post_init__(self) -> None:
        if not self.session_grace_seconds > 0:
            raise InvalidArgumentError("scalable_topics.session_grace_seconds must be > 0")
        if not 1 <= self.controller_lease_seconds <= 3600:
            raise InvalidArgumentError("scalable_topics.controller_lease_seconds must be 1-3600")
        if self.auto_split_rate < 0 or not self.auto_split_interval_seconds > 0 or self.max_segments < 1:
            raise InvalidArgumentError(
                "scalable_topics: auto_split_rate >= 0, auto_split_interval_seconds > 0 and max_segments >= 1"
            )
        if self.prune_interval_seconds < 0 or self.sealed_retention_seconds < 0:
            raise InvalidArgumentError(
                "scalable_topics: prune_interval_seconds and sealed_retention_seconds must be >= 0"
            )

        if self.step_hook:
            module, _, name = self.step_hook.partition(":")
            if not module or not name:
                raise InvalidArgumentError(
                    f"scalable_topics.step_hook must be 'package.module:function', not {self.step_hook!r}"
                )

    def load_step_hook(self) -> StepHook | None:
        """The function ``step_hook`` names (None when empty); a clear error when it cannot be loaded."""
        if not self.step_hook:
            return None
        module, _, name = self.step_hook.partition(":")
        try:
            hook = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise InvalidArgumentError(
                f"scalable_topics.step_hook {self.step_hook!r} cannot be loaded: {exc}"
            ) from None
        if not callable(hook):
            raise InvalidArgumentError(f"scalable_topics.step_hook {self.step_hook!r} is not a function")
        return hook

    @classmethod
    def from_section(cls, section: Any) -> "ScalableTopicsConfig":
        if section is None:
            return cls()
        if not isinstance(section, Mapping):
            raise InvalidArgumentError("scalable_topics: expected a mapping")
        unknown = sorted(
            set(section)
            - {
                "enabled",
                "session_grace_seconds",
                "controller_lease_seconds",
                "auto_split_rate",
                "auto_split_interval_seconds",
                "max_segments",
                "prune_interval_seconds",
                "sealed_retention_seconds",
                "step_hook",
            }
        )
        if unknown:
            raise InvalidArgumentError(f"scalable_topics: unknown key(s): {', '.join(map(str, unknown))}")
        try:
            return cls(
                enabled=bool(section.get("enabled", True)),
                session_grace_seconds=float(section.get("session_grace_seconds", 30.0)),
                controller_lease_seconds=int(section.get("controller_lease_seconds", 10)),
                auto_split_rate=float(section.get("auto_split_rate", 0.0)),
                auto_split_interval_seconds=float(section.get("auto_split_interval_seconds", 10.0)),
                max_segments=int(section.get("max_segments", 64)),
                prune_interval_seconds=float(section.get("prune_interval_seconds", 30.0)),
                sealed_retention_seconds=float(section.get("sealed_retention_seconds", 3600.0)),
                step_hook=str(section.get("step_hook") or ""),
            )
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"scalable_topics: {exc}") from None
