"""Compatibility checks between two versions of a subject, one module per schema type.

The modes, against the subject's latest version, as Confluent's Schema Registry and Danube
define them:

- ``backward``: the new schema reads data written with the latest one (consumers upgrade first);
- ``forward``: the latest schema reads data written with the new one (producers upgrade first);
- ``full``: both;  ``none``: no check.

Avro and Protobuf are checked by reader/writer resolution: ``can_read(reader, writer) ->
list[str]`` gives the reasons data written with ``writer`` cannot be read with ``reader``.
JSON Schema has two rules (``JSON_SCHEMA_RULES``): ``danube`` (the default, Danube's checker:
``json_schema.py``) and ``reader_writer`` (stricter, opt-in per broker or per subject:
``json_schema_reader_writer.py``).
"""

from __future__ import annotations

from collections.abc import Callable

from danube.schema.errors import InvalidSchemaError
from danube.schema.types import ParsedSchema, normalize_mode

JSON_SCHEMA_RULES = ("danube", "reader_writer")
DEFAULT_JSON_SCHEMA_RULE = "danube"


def normalize_json_schema_rule(rule: str | None) -> str:
    r = (rule or DEFAULT_JSON_SCHEMA_RULE).strip().lower().replace("-", "_")
    if r not in JSON_SCHEMA_RULES:
        raise InvalidSchemaError(
            f"unknown JSON Schema compatibility rule {rule!r}; expected one of {', '.join(JSON_SCHEMA_RULES)}"
        )
    return r


def _reader_check(schema_type: str, json_rule: str) -> Callable[[ParsedSchema, ParsedSchema], list[str]] | None:
    # The checker modules are imported on first use, as before: a broker that only meets one
    # schema type never loads the others.
    if schema_type == "avro":
        from danube.schema.compat import avro

        return avro.can_read
    if schema_type == "json_schema":
        if json_rule != "reader_writer":
            return None
        from danube.schema.compat import json_schema_reader_writer

        return json_schema_reader_writer.can_read
    if schema_type == "protobuf":
        from danube.schema.compat import protobuf

        return protobuf.can_read
    return None


def check(latest: ParsedSchema, new: ParsedSchema, mode: str, json_rule: str = DEFAULT_JSON_SCHEMA_RULE) -> list[str]:
    """Reasons ``new`` breaks ``mode`` against ``latest`` (empty list = compatible)."""
    mode = normalize_mode(mode)
    if mode == "none":
        return []
    if latest.schema_type != new.schema_type:
        return [f"schema type changed from {latest.schema_type} to {new.schema_type}"]
    json_rule = normalize_json_schema_rule(json_rule)
    if new.schema_type == "json_schema" and json_rule == "danube":
        from danube.schema.compat import json_schema

        return json_schema.check(latest, new, mode)
    can_read = _reader_check(new.schema_type, json_rule)
    if can_read is None:
        return []  # bytes, string, number: nothing to evolve
    reasons: list[str] = []
    if mode in ("backward", "full"):
        reasons += [f"backward: {r}" for r in can_read(new, latest)]
    if mode in ("forward", "full"):
        reasons += [f"forward: {r}" for r in can_read(latest, new)]
    return reasons
