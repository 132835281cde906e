"""load_manager.rebalancing: Danube's keys, defaults and aggressiveness presets."""

from __future__ import annotations

import pytest

from danube.cluster.rebalancing.config import PRESETS, RebalancingConfig
from danube.errors import InvalidArgumentError
from danube.server.config import BrokerConfig


def test_defaults_are_danubes():
    c = RebalancingConfig.from_dict(None)
    assert (
        c.enabled,
        c.aggressiveness,
        c.check_interval_seconds,
        c.max_moves_per_hour,
        c.cooldown_seconds,
        c.min_brokers_for_rebalance,
        c.min_topic_age_seconds,
        c.blacklist_topics,
    ) == (False, "balanced", 300.0, 10, 60.0, 2, 300.0, ())
    assert c.cv_threshold == 0.30 and c.strategy == "balanced" and c.planner == "plan"
    assert c == RebalancingConfig()


@pytest.mark.parametrize(
    "level, threshold, interval, moves",
    [("conservative", 0.40, 600.0, 5), ("balanced", 0.30, 300.0, 10), ("aggressive", 0.20, 120.0, 20)],
)
def test_presets(level, threshold, interval, moves):
    c = RebalancingConfig.from_dict({"aggressiveness": level})
    assert (c.cv_threshold, c.check_interval_seconds, c.max_moves_per_hour) == (threshold, interval, moves)
    assert c.cooldown_seconds == PRESETS[level].cooldown_seconds


def test_explicit_keys_win_over_the_preset():
    data = {
        "load_manager": {
            "assignment_strategy": "fair",
            "rebalancing": {
                "enabled": True,
                "aggressiveness": "aggressive",
                "check_interval_seconds": 30,
                "max_moves_per_hour": 3,
                "cooldown_seconds": 5,
                "min_brokers_for_rebalance": 3,
                "min_topic_age_seconds": 0,
                "blacklist_topics": ["/system/*", "/analytics/logs"],
            },
        }
    }
    c = BrokerConfig.from_dict(data).rebalancing
    assert c.enabled and c.cv_threshold == 0.20 and c.check_interval_seconds == 30.0
    assert (c.max_moves_per_hour, c.cooldown_seconds, c.min_brokers_for_rebalance, c.min_topic_age_seconds) == (
        3,
        5.0,
        3,
        0.0,
    )
    assert c.blacklist_topics == ("/system/*", "/analytics/logs") and c.strategy == "fair"
    assert RebalancingConfig.from_dict({"cv_threshold": 0.5}).cv_threshold == 0.5


@pytest.mark.parametrize(
    "section, fragment",
    [
        ({"aggressivness": "balanced"}, "unknown key"),
        ({"aggressiveness": "wild"}, "aggressiveness"),
        ({"enabled": "yes"}, "enabled"),
        ({"max_moves_per_hour": -1}, "max_moves_per_hour"),
        ({"min_brokers_for_rebalance": 1}, "min_brokers_for_rebalance"),
        ({"check_interval_seconds": 0}, "check_interval_seconds"),
        ({"cooldown_seconds": float("nan")}, "cooldown_seconds"),
        ({"blacklist_topics": "/system/*"}, "blacklist_topics"),
        ({"planner": "magic"}, "planner"),
    ],
)
def test_bad_values_are_rejected(section, fragment):
    with pytest.raises(InvalidArgumentError, match=fragment):
        RebalancingConfig.from_dict(section)


def test_from_yaml(tmp_path):
    path = tmp_path / "danube_broker.yml"
    path.write_text(
        "load_manager:\n  load_report_interval_seconds: 30\n  assignment_strategy: weighted_load\n"
        "  rebalancing:\n    enabled: true\n    aggressiveness: conservative\n"
        "    blacklist_topics: ['/system/*']\n"
    )
    c = BrokerConfig.from_yaml(str(path)).rebalancing
    assert c.enabled and c.cv_threshold == 0.40 and c.strategy == "weighted_load"
    assert c.blacklist_topics == ("/system/*",)


def test_the_broker_config_checks_the_block_at_load(tmp_path):
    assert BrokerConfig().rebalancing is None
    c = BrokerConfig.from_dict(
        {
            "load_manager": {
                "assignment_strategy": "balanced",
                "rebalancing": {"enabled": True, "aggressiveness": "aggressive", "blacklist_topics": ["/system/*"]},
            }
        }
    )
    assert isinstance(c.rebalancing, RebalancingConfig)
    assert c.rebalancing.enabled and c.rebalancing.cv_threshold == 0.20 and c.rebalancing.strategy == "balanced"
    assert BrokerConfig.from_dict({"load_manager": {"rebalancing": {}}}).rebalancing.strategy == "fair"
    with pytest.raises(
        InvalidArgumentError,
        match="unknown key load_manager.rebalancing.enable: not a setting \\(did you mean enabled\\?\\)",
    ):
        BrokerConfig.from_dict({"load_manager": {"rebalancing": {"enable": True}}})
