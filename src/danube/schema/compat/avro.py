"""Avro schema resolution (the specification's "Schema Resolution" rules): can a reader
schema read data written with a writer schema?

Works on schemas parsed by ``fastavro.parse_schema`` (full names, named types referenced by
name and looked up in the parse's named-type table)."""

from __future__ import annotations

from danube.schema.types import ParsedSchema

_PROMOTIONS = {
    ("int", "long"),
    ("int", "float"),
    ("int", "double"),
    ("long", "float"),
    ("long", "double"),
    ("float", "double"),
    ("string", "bytes"),
    ("bytes", "string"),
}
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


def can_read(reader: ParsedSchema, writer: ParsedSchema) -> list[str]:
    reasons: list[str] = []
    _Resolver(reader.named, writer.named, reasons).resolve(reader.parsed, writer.parsed, "")
    return reasons


def _kind(s) -> str:
    if isinstance(s, list):
        return "union"
    if isinstance(s, dict):
        t = s.get("type")
        return t if isinstance(t, str) and t in ("record", "error", "enum", "array", "map", "fixed") else _kind(t)
    return s


def _name_of(s) -> str:
    if isinstance(s, dict):
        return s.get("name", "")
    return s


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


class _Resolver:
    def __init__(self, rnamed: dict, wnamed: dict, reasons: list[str]) -> None:
        self.rnamed, self.wnamed, self.reasons = rnamed, wnamed, reasons
        self.seen: set[tuple[str, str]] = set()

    def _deref(self, s, named):
        while isinstance(s, str) and s not in _PRIMITIVES and s in named:
            s = named[s]
        if isinstance(s, dict) and isinstance(s.get("type"), (dict, list)) and "name" not in s:
            return self._deref(s["type"], named)
        if isinstance(s, dict) and s.get("type") in _PRIMITIVES and len(s) >= 1 and "name" not in s:
            return s["type"]  # {"type": "long", "logicalType": ...} resolves as its base type
        return s

    def matches(self, r, w) -> bool:
        """Would resolving w against r succeed (without recording reasons)?"""
        saved, self.reasons = self.reasons, []
        try:
            self.resolve(r, w, "")
            return not self.reasons
        finally:
            self.reasons = saved

    def resolve(self, r, w, path: str) -> None:
        r = self._deref(r, self.rnamed)
        w = self._deref(w, self.wnamed)
        rk, wk = _kind(r), _kind(w)
        where = path or "the schema"
        if wk == "union":
            for branch in w:
                if rk == "union":
                    if not any(self.matches(rb, branch) for rb in r):
                        self.reasons.append(
                            f"{where}: the writer's union branch {_describe(branch)} "
                            f"matches no branch of the reader's union"
                        )
                else:
                    self.resolve(r, branch, path)
            return
        if rk == "union":
            if not any(self.matches(rb, w) for rb in r):
                self.reasons.append(f"{where}: the writer's {_describe(w)} matches no branch of the reader's union")
            return
        if rk in _PRIMITIVES or wk in _PRIMITIVES:
            if rk != wk and (wk, rk) not in _PROMOTIONS:
                self.reasons.append(f"{where}: type {wk} cannot be read as {rk}")
            return
        if rk != wk and not ({rk, wk} <= {"record", "error"}):
            self.reasons.append(f"{where}: type {wk} cannot be read as {rk}")
            return
        if rk in ("record", "error", "enum", "fixed"):
            rn, wn = _name_of(r), _name_of(w)
            aliases = {a for a in r.get("aliases", [])} | {_short(a) for a in r.get("aliases", [])}
            if _short(rn) != _short(wn) and wn not in aliases and _short(wn) not in aliases:
                self.reasons.append(f"{where}: {rk} name {wn} does not match the reader's {rn}")
                return
        if rk == "fixed":
            if r.get("size") != w.get("size"):
                self.reasons.append(
                    f"{where}: fixed {r.get('name')} size {w.get('size')} cannot be read as size {r.get('size')}"
                )
        elif rk == "enum":
            missing = [s for s in w.get("symbols", []) if s not in r.get("symbols", [])]
            if missing and "default" not in r:
                self.reasons.append(
                    f"{where}: enum {r.get('name')} lacks the writer's symbols {missing} and has no default"
                )
        elif rk == "array":
            self.resolve(r["items"], w["items"], f"{path}[]")
        elif rk == "map":
            self.resolve(r["values"], w["values"], f"{path}{{}}")
        elif rk in ("record", "error"):
            key = (r.get("name", ""), w.get("name", ""))
            if key in self.seen:
                return  # recursive type already being resolved
            self.seen.add(key)
            wfields = {f["name"]: f for f in w.get("fields", [])}
            for f in r.get("fields", []):
                fpath = f"{path}.{f['name']}" if path else f["name"]
                wf = wfields.get(f["name"])
                if wf is None:
                    for alias in f.get("aliases", []):
                        wf = wfields.get(alias)
                        if wf is not None:
                            break
                if wf is None:
                    if "default" not in f:
                        self.reasons.append(
                            f"field '{fpath}' is missing in the writer's schema and has no default in the reader's"
                        )
                    continue
                self.resolve(f["type"], wf["type"], fpath)


def _describe(s) -> str:
    k = _kind(s)
    if k in ("record", "error", "enum", "fixed"):
        return f"{k} {_name_of(s)}"
    return str(k)
