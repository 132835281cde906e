"""The ``load_manager.rebalancing`` block of danube_broker.yml (Danube's keys and defaults).

::

    load_manager:
      assignment_strategy: balanced       # fair | balanced | weighted_load (also the rebalancer's load score)
      rebalancing:
        enabled: false                    # start disabled, enable after testing
        aggressiveness: balanced          # conservative | balanced | aggressive
        check_interval_seconds: 300       # how often the leader checks the balance
        max_moves_per_hour: 10            # rate limit, counted from the rebalancing history
        cooldown_seconds: 60              # between two moves, and before a moved topic may move again
        min_brokers_for_rebalance: 2      # fewer active brokers: no rebalancing
        min_topic_age_seconds: 300        # younger topics never move
        blacklist_topics: []              # exact names or prefixes ending in '*' ("/system/*")

The aggressiveness level always sets the CV threshold (conservative 0.40, balanced
0.30, aggressive 0.20) and supplies the defaults of the three keys it presets
(check interval / max moves per hour / cooldown: conservative 600 s / 5 / 120 s,
balanced 300 s / 10 / 60 s, aggressive 120 s / 20 / 30 s); a key written in the
file wins over the preset.  Danube's load manager page gives the interval and the hourly
limit of each level and the 60 s default cooldown of ``balanced``; the
conservative and aggressive cooldowns (twice and half the default) are ours.

Hysteresis (not a key): once the CV reached the threshold, the planner keeps
moving until the CV is under 0.9 × the threshold, so it does not hover at the
threshold where every report's noise would start another move.

Two optional keys beyond Danube's: ``cv_threshold`` (overrides the level's
threshold) and ``planner`` (``plan``, the default: the multi-move planner;
``greedy``: Danube's one-lightest-topic selection).  Unknown keys are an
error, so a typo does not silently leave rebalancing at its defaults.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from danube.cluster.scoring import AGGRESSIVENESS_THRESHOLDS, STRATEGIES
from danube.errors import InvalidArgumentError
from danube.settings import ConfigError, load_section


@dataclass(frozen=True)
class Preset:
    cv_threshold: float
    check_interval_seconds: float
    max_moves_per_hour: int
    cooldown_seconds: float


PRESETS: dict[str, Preset] = {
    "conservative": Preset(AGGRESSIVENESS_THRESHOLDS["conservative"], 600.0, 5, 120.0),
    "balanced": Preset(AGGRESSIVENESS_THRESHOLDS["balanced"], 300.0, 10, 60.0),
    "aggressive": Preset(AGGRESSIVENESS_THRESHOLDS["aggressive"], 120.0, 20, 30.0),
}
PLANNERS = ("plan", "greedy")
# a topic moved from broker A is not moved back to A within this window (anti-oscillation)
OSCILLATION_WINDOW_SECONDS = 3600.0
RATE_WINDOW_SECONDS = 3600.0

_KEYS = (
    "enabled",
    "aggressiveness",
    "check_interval_seconds",
    "max_moves_per_hour",
    "cooldown_seconds",
    "min_brokers_for_rebalance",
    "min_topic_age_seconds",
    "blacklist_topics",
    "cv_threshold",
    "planner",
)


@dataclass(frozen=True)
class RebalancingConfig:
    enabled: bool = False
    aggressiveness: str = "balanced"
    check_interval_seconds: float = 300.0
    max_moves_per_hour: int = 10
    cooldown_seconds: float = 60.0
    min_brokers_for_rebalance: int = 2
    min_topic_age_seconds: float = 300.0
    blacklist_topics: tuple[str, ...] = ()
    cv_threshold: float = AGGRESSIVENESS_THRESHOLDS["balanced"]
    planner: str = "plan"
    # load_manager.assignment_strategy: the broker load score the balance is computed on
    strategy: str = "balanced"
    # hysteresis: once the CV reached the threshold the planner keeps going until it is under
    # target_ratio × threshold, so the CV does not hover (and moves do not flap) at the threshold
    target_ratio: float = 0.9
    explicit: frozenset = field(default=frozenset(), compare=False, repr=False)

    @classmethod
    def for_aggressiveness(cls, aggressiveness: str = "balanced", **overrides: Any) -> "RebalancingConfig":
        """The preset of ``aggressiveness`` with ``overrides`` (same names as the YAML keys)."""
        section = dict(overrides)
        strategy = section.pop("strategy", "balanced")
        section["aggressiveness"] = aggressiveness
        return cls.from_dict(section, strategy=strategy)

    @classmethod
    def from_dict(
        cls, section: Mapping[str, Any] | None, *, strategy: str = "balanced", path: str = "load_manager.rebalancing"
    ) -> "RebalancingConfig":
        """The ``rebalancing:`` mapping itself (``None`` → defaults), through the one settings loader."""
        return load_section(cls, section, path, strategy=strategy)

    @classmethod
    def parse_section(
        cls, section: Mapping[str, Any], where: str, *, strategy: str = "balanced"
    ) -> "RebalancingConfig":
        """The loader's hook: the level's preset under the keys the file gives."""
        unknown = sorted(map(str, set(section) - set(_KEYS)))
        if unknown:
            close = difflib.get_close_matches(unknown[0], _KEYS, n=1)
            hint = f"did you mean {close[0]}?" if close else f"the settings here are {', '.join(_KEYS)}"
            raise ConfigError(f"unknown key {where}.{unknown[0]}", f"not a setting ({hint})")
        if strategy not in STRATEGIES:
            raise InvalidArgumentError(
                f"load_manager.assignment_strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}"
            )
        level = section.get("aggressiveness", "balanced")
        if level not in PRESETS:
            raise InvalidArgumentError(f"{where}.aggressiveness must be one of {', '.join(PRESETS)}, got {level!r}")
        preset = PRESETS[level]
        kw: dict[str, Any] = {
            "aggressiveness": level,
            "strategy": strategy,
            "cv_threshold": preset.cv_threshold,
            "check_interval_seconds": preset.check_interval_seconds,
            "max_moves_per_hour": preset.max_moves_per_hour,
            "cooldown_seconds": preset.cooldown_seconds,
        }
        if "enabled" in section:
            if not isinstance(section["enabled"], bool):
                raise InvalidArgumentError(f"{where}.enabled must be true or false, got {section['enabled']!r}")
            kw["enabled"] = section["enabled"]
        for name, minimum in (
            ("check_interval_seconds", 0.001),
            ("cooldown_seconds", 0.0),
            ("min_topic_age_seconds", 0.0),
        ):
            if name in section:
                kw[name] = _number(section[name], f"{where}.{name}", minimum)
        for name, minimum in (("max_moves_per_hour", 0), ("min_brokers_for_rebalance", 2)):
            if name in section:
                value = section[name]
                if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                    raise InvalidArgumentError(f"{where}.{name} must be an integer >= {minimum}, got {value!r}")
                kw[name] = value
        if "cv_threshold" in section:
            value = _number(section["cv_threshold"], f"{where}.cv_threshold", 0.0)
            if value <= 0.0:
                raise InvalidArgumentError(f"{where}.cv_threshold must be > 0, got {value!r}")
            kw["cv_threshold"] = value
        if "blacklist_topics" in section:
            patterns = section["blacklist_topics"] or []
            if isinstance(patterns, str) or not all(isinstance(p, str) and p for p in patterns):
                raise InvalidArgumentError(
                    f"{where}.blacklist_topics must be a list of topic names or "
                    f"patterns ending in '*', got {patterns!r}"
                )
            kw["blacklist_topics"] = tuple(patterns)
        if "planner" in section:
            if section["planner"] not in PLANNERS:
                raise InvalidArgumentError(
                    f"{where}.planner must be one of {', '.join(PLANNERS)}, got {section['planner']!r}"
                )
            kw["planner"] = section["planner"]
        return cls(explicit=frozenset(section), **kw)

    @classmethod
    def from_danube_config(cls, data: Mapping[str, Any] | None) -> "RebalancingConfig":
        """From a whole danube_broker.yml mapping (its ``load_manager`` section; defaults if absent)."""
        data = data or {}
        if not isinstance(data, Mapping):
            raise InvalidArgumentError("configuration: expected a mapping")
        load_manager = data.get("load_manager") or {}
        if not isinstance(load_manager, Mapping):
            raise InvalidArgumentError("load_manager: expected a mapping")
        strategy = load_manager.get("assignment_strategy", "balanced")
        return cls.from_dict(load_manager.get("rebalancing"), strategy=strategy)

    @classmethod
    def from_yaml(cls, path: str) -> "RebalancingConfig":
        import yaml

        with open(path, encoding="utf-8") as f:
            return cls.from_danube_config(yaml.safe_load(f) or {})

    @property
    def target_cv(self) -> float:
        return self.cv_threshold * self.target_ratio

    def with_overrides(self, **kw: Any) -> "RebalancingConfig":
        return replace(self, **kw)

    def to_dict(self) -> dict:
        return {
            "enabled": self.enabled,
            "aggressiveness": self.aggressiveness,
            "check_interval_seconds": self.check_interval_seconds,
            "max_moves_per_hour": self.max_moves_per_hour,
            "cooldown_seconds": self.cooldown_seconds,
            "min_brokers_for_rebalance": self.min_brokers_for_rebalance,
            "min_topic_age_seconds": self.min_topic_age_seconds,
            "blacklist_topics": list(self.blacklist_topics),
            "cv_threshold": self.cv_threshold,
            "planner": self.planner,
            "strategy": self.strategy,
        }


def _number(value: Any, where: str, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < minimum:
        raise InvalidArgumentError(f"{where} must be a number >= {minimum:g}, got {value!r}")
    return float(value)
