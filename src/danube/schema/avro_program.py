"""An Avro schema compiled into a flat program for the payload checkers
(``danube._core.avrocheck``, compiled; ``danube._pure.avrocheck``, its twin).

Payload validation on the batch lane must cost a fraction of what storing the message costs
(~0.35 µs of broker CPU per 100 B message), and decoding every record into Python objects with
fastavro costs ~6 µs.  The checkers instead walk the Avro binary encoding against this program
without building any object: same acceptance as fastavro's reader for the encoding itself
(varints within range, lengths within the payload, UTF-8 strings, union and enum
indexes in range, array/map blocks), and the payload must end exactly where the datum ends.
Logical types are checked as their underlying type.

Program: a list of ints; node ``i`` starts with an opcode::

    NULL BOOLEAN INT LONG FLOAT DOUBLE BYTES STRING   (no operands)
    FIXED size | ENUM n_symbols | ARRAY item | MAP value
    UNION n branch_1 .. branch_n | RECORD n field_1 .. field_n

Operands that name nodes are their start index, so named types are compiled once and recursive
types refer back to themselves.  The root is node 0.
"""

from __future__ import annotations

from array import array

NULL, BOOLEAN, INT, LONG, FLOAT, DOUBLE, BYTES, STRING, FIXED, ENUM, UNION, ARRAY, MAP, RECORD = range(14)
_PRIMS = {
    "null": NULL,
    "boolean": BOOLEAN,
    "int": INT,
    "long": LONG,
    "float": FLOAT,
    "double": DOUBLE,
    "bytes": BYTES,
    "string": STRING,
}


def compile_avro(schema, named: dict) -> array:
    """``schema`` as fastavro.parse_schema returns it, ``named`` its named-type table."""
    prog: list[int] = []
    by_name: dict[str, int] = {}

    def emit(s) -> int:
        if isinstance(s, str):
            if s in _PRIMS:
                at = len(prog)
                prog.append(_PRIMS[s])
                return at
            if s in by_name:
                return by_name[s]
            return emit(named[s])
        if isinstance(s, list):
            at = len(prog)
            prog.extend([UNION, len(s)] + [0] * len(s))
            for i, branch in enumerate(s):
                prog[at + 2 + i] = emit(branch)
            return at
        t = s.get("type")
        if isinstance(t, (dict, list)) or (isinstance(t, str) and t in _PRIMS):
            return emit(t)  # {"type": "long", "logicalType": ...} or a wrapped type
        at = len(prog)
        if t in ("record", "error"):
            fields = s.get("fields", [])
            by_name[s["name"]] = at
            prog.extend([RECORD, len(fields)] + [0] * len(fields))
            for i, f in enumerate(fields):
                prog[at + 2 + i] = emit(f["type"])
        elif t == "enum":
            by_name[s["name"]] = at
            prog.extend([ENUM, len(s.get("symbols", []))])
        elif t == "fixed":
            by_name[s["name"]] = at
            prog.extend([FIXED, int(s["size"])])
        elif t == "array":
            prog.extend([ARRAY, 0])
            prog[at + 1] = emit(s["items"])
        elif t == "map":
            prog.extend([MAP, 0])
            prog[at + 1] = emit(s["values"])
        elif isinstance(t, str) and t in named:
            return emit(named[t])
        else:
            raise ValueError(f"cannot compile Avro type {t!r}")
        return at

    emit(schema)
    return array("i", prog)
