"""The broker's scalable_topics: section."""

import pytest

from danube.errors import InvalidArgumentError
from danube.routing.scalable.config import ScalableTopicsConfig
from danube.server.config import BrokerConfig


def test_section_defaults_and_values():
    assert BrokerConfig().scalable_topics is None
    cfg = BrokerConfig.from_dict({"scalable_topics": {"session_grace_seconds": 5, "controller_lease_seconds": 4}})
    assert cfg.scalable_topics == ScalableTopicsConfig(True, 5.0, 4)
    auto = BrokerConfig.from_dict({"scalable_topics": {"auto_split_rate": 5000, "max_segments": 8}}).scalable_topics
    assert (auto.auto_split_rate, auto.max_segments, auto.auto_split_interval_seconds) == (5000.0, 8, 10.0)
    assert BrokerConfig.from_dict({"scalable_topics": {"enabled": False}}).scalable_topics.enabled is False
    with pytest.raises(InvalidArgumentError):
        BrokerConfig.from_dict({"scalable_topics": {"grace": 5}})
    with pytest.raises(InvalidArgumentError):
        BrokerConfig.from_dict({"scalable_topics": {"session_grace_seconds": 0}})
    with pytest.raises(InvalidArgumentError):
        BrokerConfig.from_dict({"scalable_topics": [1]})
