"""Protobuf compatibility: field numbers and types, message by message (wire rules).

Messages are matched by full name, starting from the schema's first message and following
message-typed fields.  For each field number both sides have: the wire types must agree
(int32/uint32/int64/uint64/bool/enum share varint; sint32/sint64; fixed32/sfixed32;
fixed64/sfixed64; string/bytes; a message type must be a message type of a compatible shape),
repeated must stay repeated, and a field may not move into or out of a oneof.  Fields only
the writer has are skipped by the reader (fine); a field only the reader has is fine unless
it is ``required`` (proto2).  A field number reused with another type is the classic break.
"""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor as F

from danube.schema.types import ParsedSchema, protobuf_main_message

_VARINT = {F.TYPE_INT32, F.TYPE_UINT32, F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_BOOL, F.TYPE_ENUM}
_GROUPS = [
    _VARINT,
    {F.TYPE_SINT32, F.TYPE_SINT64},
    {F.TYPE_FIXED32, F.TYPE_SFIXED32},
    {F.TYPE_FIXED64, F.TYPE_SFIXED64},
    {F.TYPE_STRING, F.TYPE_BYTES},
]
_NAMES = {v: k[5:].lower() for k, v in vars(F).items() if k.startswith("TYPE_")}


def can_read(reader: ParsedSchema, writer: ParsedSchema) -> list[str]:
    reasons: list[str] = []
    r, w = protobuf_main_message(reader), protobuf_main_message(writer)
    if r.name != w.name:
        reasons.append(f"message {w.full_name} was replaced by {r.full_name}")
    _message(r, w, set(), reasons)
    return reasons


def _compatible_types(a: int, b: int) -> bool:
    if a == b:
        return True
    return any(a in g and b in g for g in _GROUPS)


def _message(r, w, seen: set, reasons: list[str]) -> None:
    key = (r.full_name, w.full_name)
    if key in seen:
        return
    seen.add(key)
    wfields = {f.number: f for f in w.fields}
    for rf in r.fields:
        wf = wfields.get(rf.number)
        where = f"{r.full_name}.{rf.name} (field {rf.number})"
        if wf is None:
            if _required(rf):
                reasons.append(f"{where}: required by the reader but the writer has no field {rf.number}")
            continue
        if rf.type == F.TYPE_MESSAGE or wf.type == F.TYPE_MESSAGE:
            if rf.type != wf.type:
                reasons.append(f"{where}: type {_NAMES.get(wf.type)} cannot be read as {_NAMES.get(rf.type)}")
            else:
                _message(rf.message_type, wf.message_type, seen, reasons)
        elif not _compatible_types(rf.type, wf.type):
            reasons.append(f"{where}: type {_NAMES.get(wf.type)} cannot be read as {_NAMES.get(rf.type)}")
        rrep, wrep = _repeated(rf), _repeated(wf)
        if rrep != wrep:
            reasons.append(
                f"{where}: {'repeated' if wrep else 'singular'} in the writer, "
                f"{'repeated' if rrep else 'singular'} in the reader"
            )
        r_oneof = rf.containing_oneof is not None and not _synthetic(rf.containing_oneof)
        w_oneof = wf.containing_oneof is not None and not _synthetic(wf.containing_oneof)
        if r_oneof != w_oneof:
            reasons.append(f"{where}: moved {'into' if r_oneof else 'out of'} a oneof")


def _repeated(f) -> bool:
    # protobuf 7 dropped FieldDescriptor.label for is_repeated / is_required
    rep = getattr(f, "is_repeated", None)
    return rep if rep is not None else f.label == F.LABEL_REPEATED


def _required(f) -> bool:
    req = getattr(f, "is_required", None)
    return req if req is not None else f.label == F.LABEL_REQUIRED


def _synthetic(oneof) -> bool:
    # proto3 `optional` fields live in a synthetic oneof named _<field>
    fields = oneof.fields
    return len(fields) == 1 and oneof.name == "_" + fields[0].name
