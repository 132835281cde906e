"""JSON Schema compatibility, the stricter reader/writer rule (opt-in: ``json_schema_rule:
reader_writer``): can every document valid under the writer schema be read with the reader
schema?  The default is Danube's rule (``json_schema.py``).

Understood: ``type`` (a name or a list), ``properties``, ``required``,
``additionalProperties`` (boolean), ``items`` (one schema), ``enum``, and ``integer`` ⊂
``number``.  Allowed changes therefore are added optional properties, removed properties (when
the reader accepts additional properties), type widening (integer → number, a type added to a
list, an enum value added).  Anything else the reader adds (a new required property, a
narrower type, ``additionalProperties: false`` over properties the writer had) is a reason.
Keywords outside the subset (patterns, bounds, ``$ref``, combinators) are compared as a whole:
a change to them is reported as not provably compatible.
"""

from __future__ import annotations

import json

from danube.schema.types import ParsedSchema

_STRUCTURAL = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "title",
    "description",
    "$schema",
    "$id",
    "default",
    "examples",
    "$comment",
}


def can_read(reader: ParsedSchema, writer: ParsedSchema) -> list[str]:
    reasons: list[str] = []
    _check(reader.parsed, writer.parsed, "", reasons)
    return reasons


def _types(s: dict) -> set[str] | None:
    t = s.get("type")
    if t is None:
        return None  # any type
    types = {t} if isinstance(t, str) else set(t)
    if "number" in types:
        types.add("integer")  # number includes integer
    return types


def _check(r, w, path: str, reasons: list[str]) -> None:
    where = path or "root"
    if r is True or r == {}:
        return  # the reader accepts anything
    if w is True or w == {}:
        if r is not True:
            reasons.append(f"{where}: the writer allows any value, the reader restricts it")
        return
    if r is False:
        reasons.append(f"{where}: the reader accepts nothing")
        return
    if w is False:
        return
    rt, wt = _types(r), _types(w)
    if rt is not None:
        if wt is None:
            reasons.append(f"{where}: the writer allows any type, the reader only {sorted(rt)}")
        elif not wt <= rt:
            reasons.append(f"{where}: type {_fmt(w.get('type'))} cannot be read as {_fmt(r.get('type'))}")
    if "enum" in r:
        if "enum" not in w:
            reasons.append(f"{where}: the reader restricts values to an enum the writer does not have")
        else:
            missing = [v for v in w["enum"] if v not in r["enum"]]
            if missing:
                reasons.append(f"{where}: enum values {missing} written are not in the reader's enum")
    for key in sorted((set(r) | set(w)) - _STRUCTURAL):
        if json.dumps(r.get(key), sort_keys=True) != json.dumps(w.get(key), sort_keys=True):
            if key in r:
                reasons.append(f"{where}: keyword '{key}' changed (outside the additive subset)")
    rprops, wprops = r.get("properties", {}) or {}, w.get("properties", {}) or {}
    rreq, wreq = set(r.get("required", []) or []), set(w.get("required", []) or [])
    r_additional = r.get("additionalProperties", True)
    for name in sorted(rreq - wreq):
        reasons.append(f"{where}: property '{name}' is required by the reader but optional or absent in the writer")
    for name, wsub in sorted(wprops.items()):
        sub = f"{path}.{name}" if path else name
        if name in rprops:
            _check(rprops[name], wsub, sub, reasons)
        elif r_additional is False:
            reasons.append(f"{where}: property '{name}' written but the reader has additionalProperties false")
        elif isinstance(r_additional, dict):
            _check(r_additional, wsub, sub, reasons)
    w_additional = w.get("additionalProperties", True)
    if w_additional is not False:
        for name in sorted(set(rprops) - set(wprops)):
            # the writer may have written anything under a name the reader now types
            if rprops[name] not in (True, {}):
                if w_additional is True:
                    reasons.append(
                        f"{where}: property '{name}' added with a type, but the writer allows "
                        "any value under additional properties"
                    )
                else:
                    _check(rprops[name], w_additional, f"{path}.{name}" if path else name, reasons)
    if "items" in r or "items" in w:
        ri, wi = r.get("items", True), w.get("items", True)
        if isinstance(ri, (dict, bool)) and isinstance(wi, (dict, bool)):
            _check(ri, wi, f"{path}[]", reasons)


def _fmt(t) -> str:
    return t if isinstance(t, str) else "[" + ", ".join(t) + "]" if t else "any"
