"""The schema tag a frame carries: one attribute, ``danube.schema = "<id>:<version>"``.

Its own module, with no dependencies, because producers (``danube.client``) write it and the
client must not import the registry or the metadata store that ``danube.schema.validation`` needs.
"""

from __future__ import annotations

SCHEMA_ATTR = "danube.schema"  # value "<schema id>:<version>"


def schema_value(schema_id: int, version: int | None) -> str:
    """The :data:`SCHEMA_ATTR` value: ``"<id>:<version>"`` (``"<id>"`` without a version)."""
    return f"{int(schema_id)}:{int(version)}" if version is not None else str(int(schema_id))


def schema_attributes(schema_id: int, version: int) -> dict[str, str]:
    return {SCHEMA_ATTR: schema_value(schema_id, version)}


def parse_schema_value(value: str | None) -> tuple[int | None, int | None]:
    """(schema id, version) from a :data:`SCHEMA_ATTR` value; (None, None) when absent or malformed."""
    if not value:
        return None, None
    sid, _, ver = value.partition(":")
    try:
        return int(sid), int(ver) if ver else None
    except ValueError:
        return None, None


def split_schema_attributes(attributes: dict) -> tuple[dict, int | None, int | None]:
    """(attributes without the schema attribute, schema id, version) of a stored frame."""
    if not attributes or SCHEMA_ATTR not in attributes:
        return attributes, None, None
    sid, ver = parse_schema_value(attributes[SCHEMA_ATTR])
    if sid is None:
        return attributes, None, None
    attrs = dict(attributes)
    del attrs[SCHEMA_ATTR]
    return attrs, sid, ver
