"""JSON Schema compatibility as Danube's checker decides it (the default rule).

Only the top level's ``properties`` and ``required`` are looked at, and only three changes break:

- backward (the new schema reads old data): a required property removed from ``properties``, or
  a property the old schema had as optional made required;
- forward (the old schema reads new data): a newly required property the old schema did not have;
- both: a property's ``type`` changed (compared as written: ``integer`` → ``number`` is a change).

Everything else is compatible: added or removed optional properties, ``additionalProperties``,
nested schemas, keywords.  ``full`` reports the backward reasons when there are any, else the
forward ones, as Danube does.  The stricter reader/writer rule is ``json_schema_reader_writer``.
"""

from __future__ import annotations

from danube.schema.types import ParsedSchema


def check(old: ParsedSchema, new: ParsedSchema, mode: str) -> list[str]:
    """Reasons ``new`` breaks ``mode`` against ``old`` (``backward``, ``forward`` or ``full``)."""
    if mode == "backward":
        return _backward(old.parsed, new.parsed)
    if mode == "forward":
        return _forward(old.parsed, new.parsed)
    if mode == "full":
        return _backward(old.parsed, new.parsed) or _forward(old.parsed, new.parsed)
    return []


def _properties(schema) -> dict | None:
    props = schema.get("properties") if isinstance(schema, dict) else None
    return props if isinstance(props, dict) else None


def _required(schema) -> list[str]:
    req = schema.get("required") if isinstance(schema, dict) else None
    return [r for r in req if isinstance(r, str)] if isinstance(req, list) else []


def _type_changes(old, new, direction: str) -> list[str]:
    old_props, new_props = _properties(old), _properties(new)
    if old_props is None or new_props is None:
        return []
    reasons = []
    for name, old_prop in old_props.items():
        new_prop = new_props.get(name)
        if isinstance(old_prop, dict) and isinstance(new_prop, dict) and "type" in old_prop and "type" in new_prop:
            if old_prop["type"] != new_prop["type"]:
                reasons.append(
                    f"{direction}: type of property '{name}' changed from {old_prop['type']!r} to {new_prop['type']!r}"
                )
    return reasons


def _backward(old, new) -> list[str]:
    old_props, new_props = _properties(old) or {}, _properties(new) or {}
    old_required, new_required = _required(old), _required(new)
    reasons = [f"backward: required property '{name}' removed" for name in old_required if name not in new_props]
    reasons += [
        f"backward: optional property '{name}' made required"
        for name in new_required
        if name in old_props and name not in old_required
    ]
    return reasons + _type_changes(old, new, "backward")


def _forward(old, new) -> list[str]:
    old_props = _properties(old) or {}
    reasons = [f"forward: required property '{name}' added" for name in _required(new) if name not in old_props]
    return reasons + _type_changes(old, new, "forward")
