"""Compatibility checks between two versions of a subject, one module per schema type.

Each module offers ``can_read(reader, writer) -> list[str]``: the reasons data written with
``writer`` cannot be read with ``reader`` (empty = it can).  The modes combine them as
Confluent's Schema Registry and Danube define them, against the subject's latest version:

- ``backward``: the new schema reads data written with the latest one (consumers upgrade first);
- ``forward``: the latest schema reads data written with the new one (producers upgrade first);
- ``full``: both;  ``none``: no check.
"""

from __future__ import annotations

from danube.schema.types import ParsedSchema, normalize_mode


def _reader_check(schema_type: str):
    if schema_type == "avro":
        from danube.schema.compat import avro as mod
    elif schema_type == "json_schema":
        from danube.schema.compat import json_schema as mod
    elif schema_type == "protobuf":
        from danube.schema.compat import protobuf as mod
    else:
        return None
    return mod.can_read


def check(latest: ParsedSchema, new: ParsedSchema, mode: str) -> list[str]:
    """Reasons ``new`` breaks ``mode`` against ``latest`` (empty list = compatible)."""
    mode = normalize_mode(mode)
    if mode == "none":
        return []
    if latest.schema_type != new.schema_type:
        return [f"schema type changed from {latest.schema_type} to {new.schema_type}"]
    can_read = _reader_check(new.schema_type)
    if can_read is None:
        return []          # bytes, string, number: nothing to evolve
    reasons: list[str] = []
    if mode in ("backward", "full"):
        reasons += [f"backward: {r}" for r in can_read(new, latest)]
    if mode in ("forward", "full"):
        reasons += [f"forward: {r}" for r in can_read(latest, new)]
    return reasons
