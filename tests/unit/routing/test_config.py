"""The broker's scalable_topics: section."""

import pytest

from danube.errors import InvalidArgumentError
from danube.routing.scalable.config import ScalableTopicsConfig
from danube.server.config import BrokerConfig


def test_section_defaults_and_values():
    assert BrokerConfig().scalable_topics is None
    cfg = BrokerConfig.from_dict({"scalable_topics": {"session_grace_seconds": 5, "controller_lease_seconds": 4}})
    assert cfg.scalable_topics == ScalableTopicsConfig(True, 5.0, 4)
    assert BrokerConfig.from_dict({"scalable_topics": {"enabled": False}}).scalable_topics.enabled is False
    with pytest.raises(InvalidArgumentError):
        BrokerConfig.from_dict({"scalable_topics": {"grace": 5}})
    with pytest.raises(InvalidArgumentError):
        BrokerConfig.from_dict({"scalable_topics": {"session_grace_seconds": 0}})
    with pytest.raises(InvalidArgumentError):
        BrokerConfig.from_dict({"scalable_topics": [1]})
