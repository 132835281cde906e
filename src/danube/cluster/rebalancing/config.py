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

from dataclasses import dataclass, replace
from typing import Any, Mapping

from danube.cluster.scoring import AGGRESSIVENESS_THRESHOLDS, STRATEGIES
from danube.settings import ConfigError, check_settings, load_fields, load_section, setting


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


@dataclass(frozen=True)
class RebalancingConfig:
    enabled: bool = False
    aggressiveness: str = setting("balanced", choices=tuple(PRESETS))
    check_interval_seconds: float = setting(300.0, minimum=0.001)
    max_moves_per_hour: int = setting(10, minimum=0)
    cooldown_seconds: float = setting(60.0, minimum=0)
    min_brokers_for_rebalance: int = setting(2, minimum=2)
    min_topic_age_seconds: float = setting(300.0, minimum=0)
    blacklist_topics: tuple[str, ...] = ()  # exact names, or prefixes ending in '*'
    cv_threshold: float = setting(AGGRESSIVENESS_THRESHOLDS["balanced"], above=0)
    planner: str = setting("plan", choices=PLANNERS)
    # load_manager.assignment_strategy: the broker load score the balance is computed on
    strategy: str = setting("balanced", choices=STRATEGIES, in_file=False)
    # hysteresis: once the CV reached the threshold the planner keeps going until it is under
    # target_ratio × threshold, so the CV does not hover (and moves do not flap) at the threshold
    target_ratio: float = setting(0.9, above=0, maximum=1, in_file=False)
    explicit: frozenset = setting(frozenset(), in_file=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_settings(self)
        for i, pattern in enumerate(self.blacklist_topics):
            if not pattern:
                raise ConfigError(f"blacklist_topics[{i}]", "expected a topic name or a pattern ending in '*', got ''")

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
        values = load_fields(cls, section, where)  # unknown keys, types and ranges
        if strategy not in STRATEGIES:
            raise ConfigError(
                "load_manager.assignment_strategy", f"expected one of {'|'.join(STRATEGIES)}, got {strategy!r}"
            )
        preset = PRESETS[values.get("aggressiveness", "balanced")]
        kw: dict[str, Any] = {
            "strategy": strategy,
            "cv_threshold": preset.cv_threshold,
            "check_interval_seconds": preset.check_interval_seconds,
            "max_moves_per_hour": preset.max_moves_per_hour,
            "cooldown_seconds": preset.cooldown_seconds,
        }
        try:
            return cls(explicit=frozenset(section), **{**kw, **values})
        except ConfigError as exc:
            raise exc.under(where) from None

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
