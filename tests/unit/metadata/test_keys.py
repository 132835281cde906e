"""The one name rule (danube.metadata.keys) and what it guarantees for paths built from names."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.errors import InvalidNameError, InvalidTopicNameError
from danube.metadata import keys
from danube.storage.paths import topic_dir

HOSTILE_TOPICS = [
    "/../..",
    "/./..",
    "/../x",
    "/default/..",
    "/default/.",
    "/default/.hidden",
    "/.x/t",
    "/default/",
    "//t",
    "/default/t/",
    "/default/a/b",
    "default/t",
    "/default/t\n",
    "/default/t\x00",
    "/default/t t",
    "/default/ü",
    "/default/t\\..",
    "",
    "/",
]


@pytest.mark.parametrize("topic", HOSTILE_TOPICS)
def test_hostile_topic_names_are_refused(topic):
    with pytest.raises(InvalidTopicNameError):
        keys.split_topic(topic)


@pytest.mark.parametrize("topic", ["/default/orders", "/default/a.b", "/ns-1/t_2-part-3", "/a/b..c", "/a/b."])
def test_ordinary_topic_names_pass(topic):
    ns, name = keys.split_topic(topic)
    assert f"/{ns}/{name}" == topic


@pytest.mark.parametrize("kind", ["namespace", "subscription", "consumer", "producer"])
@pytest.mark.parametrize("name", ["", ".", "..", ".x", "a/b", "a\n", "x" * 256, "tab\t", "é"])
def test_every_kind_of_name_follows_the_same_rule(kind, name):
    with pytest.raises(InvalidNameError, match=f"invalid {kind} name"):
        keys.check_name(kind, name)
    assert keys.check_name(kind, "x" * 255) == "x" * 255


def test_keys_built_from_names_validate_every_name():
    with pytest.raises(InvalidNameError):
        keys.subscription("/default/t", "../other")
    with pytest.raises(InvalidNameError):
        keys.subscription_consumer("/default/t", "s", "..")
    with pytest.raises(InvalidNameError):
        keys.topic_producer("/default/t", "a/b")
    with pytest.raises(InvalidNameError):
        keys.namespace_policy("..")


def test_an_error_quotes_only_a_short_prefix_of_a_huge_name():
    huge = "/default/" + "x" * 100_000
    with pytest.raises(InvalidTopicNameError) as info:
        keys.split_topic(huge)
    assert len(str(info.value)) < 400 and "(100009 bytes)" in str(info.value)
    with pytest.raises(InvalidNameError) as info:
        keys.check_name("producer", "p" * 100_000)
    assert len(str(info.value)) < 400


SEGMENT_CHARS = st.sampled_from(list("aZ09_-./\\\x00\n é~:"))
SEGMENTS = st.one_of(st.sampled_from(["", ".", "..", "...", ".a", "a.", "a..b"]), st.text(SEGMENT_CHARS, max_size=8))


@settings(max_examples=500, deadline=None)
@given(ns=SEGMENTS, name=SEGMENTS)
def test_a_valid_topic_resolves_to_its_own_directory_two_levels_below_the_root(tmp_path_factory, ns, name):
    """Whatever the name, passing the rule means the path resolves to exactly <root>/<ns>/<topic>:
    never the root, a parent, the namespace directory itself or a sibling's directory."""
    root = str(tmp_path_factory.getbasetemp() / "wal")
    topic = f"/{ns}/{name}"
    try:
        keys.split_topic(topic)
    except InvalidTopicNameError:
        valid = False
    else:
        valid = True
    resolved = os.path.normpath(os.path.join(os.path.realpath(root), ns, name))
    stays_put = (
        os.path.dirname(os.path.dirname(resolved)) == os.path.realpath(root)
        and os.path.basename(resolved) == name
        and os.path.basename(os.path.dirname(resolved)) == ns
    )
    if valid:
        assert stays_put
        assert topic_dir(root, topic) == resolved
    else:
        with pytest.raises(InvalidTopicNameError):
            topic_dir(root, topic)
    if not stays_put:
        assert not valid
