"""`danube admin` parses Danube's flag placement and this project's to the same request (no broker)."""

from __future__ import annotations

import argparse

import pytest

from danube.cli import admin
from danube.cli.admin_topics import UsageError, normalize_topic


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="danube")
    admin.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["admin", *argv])


@pytest.mark.parametrize(
    "danube, ours",
    [
        (["topics", "list", "--namespace", "shop", "--output", "json"], ["-o", "json", "topics", "list", "shop"]),
        (
            ["topics", "describe", "/shop/t", "--output", "json", "--endpoint", "http://h:1"],
            ["--endpoint", "http://h:1", "--output", "json", "topics", "describe", "/shop/t"],
        ),
        (["brokers", "namespaces", "--output", "json"], ["-o", "json", "brokers", "namespaces"]),
        (["schemas", "versions", "s", "--output", "json"], ["--output", "json", "schemas", "versions", "s"]),
    ],
)
def test_danube_and_our_placement_parse_alike(danube, ours):
    a, b = parse(*danube), parse(*ours)
    for key in ("output", "endpoint", "admin_group", "admin_cmd"):
        assert getattr(a, key, None) == getattr(b, key, None), key
    assert a.output == "json"


def test_the_group_level_output_holds_when_the_command_does_not_repeat_it():
    assert parse("-o", "json", "topics", "subscriptions", "/a/b").output == "json"
    assert parse("topics", "subscriptions", "/a/b").output == "text"
    assert parse("-o", "json", "topics", "subscriptions", "/a/b", "--output", "text").output == "text"


def test_broker_id_as_danube_flag_or_positional():
    assert parse("brokers", "unload", "--broker-id", "b2", "--dry-run").broker_id_flag == "b2"
    assert parse("brokers", "activate", "b2").broker_id == "b2"


@pytest.mark.parametrize(
    "given, namespace, expected",
    [
        ("/shop/t", None, "/shop/t"),
        ("shop/t", None, "/shop/t"),
        ("t", "shop", "/shop/t"),
        ("t", "/shop", "/shop/t"),
        ("/../..", None, "/../.."),  # the broker judges names: it refuses this one with invalid_argument
    ],
)
def test_topic_spellings(given, namespace, expected):
    assert normalize_topic(given, namespace) == expected


@pytest.mark.parametrize("given", ["t", "a/b/c"])
def test_topic_without_a_namespace_is_bad_usage(given):
    with pytest.raises(UsageError):
        normalize_topic(given, None)
