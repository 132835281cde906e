"""The broker's ``scalable_topics:`` section (docs/scalable-topics.md)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Mapping

from danube.errors import InvalidArgumentError
from danube.routing.scalable.contracts import StepHook
from danube.settings import check_settings, load_section, setting


@dataclass(frozen=True)
class ScalableTopicsConfig:
    enabled: bool = True  # PIP-468's scalableTopicEnabled
    # a disconnected ordered consumer keeps its segments this long
    session_grace_seconds: float = setting(30.0, above=0)
    controller_lease_seconds: int = setting(10, minimum=1, maximum=3600)  # standalone: the controller's lease TTL
    # msgs/s of one active segment that makes its leader split it; 0 = off
    auto_split_rate: float = setting(0.0, minimum=0)
    auto_split_interval_seconds: float = setting(10.0, above=0)
    max_segments: int = setting(64, minimum=1)  # automatic splits stop at this many active segments
    # how often the leader looks for sealed segments to prune; 0 = never
    prune_interval_seconds: float = setting(30.0, minimum=0)
    # a drained sealed segment is kept this long before it is pruned
    sealed_retention_seconds: float = setting(3600.0, minimum=0)
    # debugging: "package.module:function", an async function awaited with the name of each step a
    # split, merge or prune passes (contracts.STEPS, PRUNE_STEP): where fault-injection tests make a
    # broker process die; empty (the default) in normal operation
    step_hook: str = ""

    def __post_init__(self) -> None:
        check_settings(self)
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
    def from_dict(cls, data: Mapping[str, Any] | None, path: str = "scalable_topics") -> "ScalableTopicsConfig":
        return load_section(cls, data, path)
