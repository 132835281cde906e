"""Batch-lane ``PublishRequest`` bytes for the differential tests of danube's own reader
(``danube._core.publish_request`` and its pure twin) against protobuf: well-formed requests,
requests written field by field as protobuf never writes them (any order, repeats, unknown
fields, groups, other wire types, overlong varints), and those bytes damaged."""

from __future__ import annotations

from hypothesis import strategies as st

from danube.proto.danube_batch import batch_pb2 as pb

U64 = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 127, 128, 2**32 - 1, 2**32, 2**63, 2**64 - 1]))


def reference(data: bytes):
    """What protobuf reads from ``data``, as the reader's fields; None when it refuses."""
    try:
        m = pb.PublishRequest.FromString(data)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError (and nothing else) refuses
        return None
    which = m.WhichOneof("producer")
    return (
        m.sequence,
        m.producer_id if which == "producer_id" else None,
        m.create.SerializeToString(deterministic=True) if which == "create" else None,
        m.frames,
        m.partitioning_version if m.HasField("partitioning_version") else None,
        m.schema_id if m.HasField("schema_id") else None,
        m.schema_version if m.HasField("schema_version") else None,
    )


def fields_of(request) -> tuple:
    """A parsed request's fields, in ``reference``'s shape."""
    create = request.create.SerializeToString(deterministic=True) if request.create is not None else None
    return (
        request.sequence,
        request.producer_id,
        create,
        request.frames,
        request.partitioning_version,
        request.schema_id,
        request.schema_version,
    )


@st.composite
def requests(draw) -> bytes:
    """A request as protobuf writes it."""
    kwargs: dict = {"sequence": draw(U64), "frames": draw(st.binary(max_size=200))}
    choice = draw(st.sampled_from(["id", "create", None]))
    if choice == "id":
        kwargs["producer_id"] = draw(U64)
    elif choice == "create":
        kwargs["create"] = pb.ProducerSpec(
            topic=draw(st.text(max_size=20)),
            producer_name=draw(st.text(max_size=10)),
            access_mode=draw(st.sampled_from([0, 1])),
            reliable=draw(st.booleans()),
            schema_subject=draw(st.text(max_size=5)),
        )
    for name in ("partitioning_version", "schema_id"):
        if draw(st.booleans()):
            kwargs[name] = draw(U64)
    if draw(st.booleans()):
        kwargs["schema_version"] = draw(st.integers(0, 2**32 - 1))
    return pb.PublishRequest(**kwargs).SerializeToString()


def varint(value: int, extra: int = 0) -> bytes:
    """``value`` as a varint, with ``extra`` overlong continuation bytes."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value or extra:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            break
        if not value:
            extra -= 1
            if not extra:
                out.append(0)
                break
    return bytes(out)


@st.composite
def field(draw, depth: int = 0) -> bytes:
    """One field, written by hand: a known or unknown number, any wire type."""
    number = draw(st.one_of(st.integers(1, 8), st.sampled_from([0, 15, 16, 2**29 - 1])))
    wire_type = draw(st.sampled_from([0, 0, 0, 1, 2, 2, 2, 3, 4, 5, 6, 7]))
    tag = varint(number << 3 | wire_type, draw(st.sampled_from([0, 0, 0, 1, 4])))
    if wire_type == 0:
        return tag + varint(draw(st.integers(0, 2**70)), draw(st.sampled_from([0, 0, 1, 3])))
    if wire_type == 1:
        return tag + draw(st.binary(min_size=8, max_size=8))
    if wire_type == 5:
        return tag + draw(st.binary(min_size=4, max_size=4))
    if wire_type == 2:
        if number == 3 and draw(st.booleans()):
            body = pb.ProducerSpec(
                topic=draw(st.text(max_size=8)), producer_name=draw(st.text(max_size=8))
            ).SerializeToString()
        elif depth < 2 and draw(st.booleans()):
            body = b"".join(draw(st.lists(field(depth + 1), max_size=3)))
        else:
            body = draw(st.binary(max_size=30))
        return tag + varint(len(body), draw(st.sampled_from([0, 0, 1, 4]))) + body
    if wire_type == 3 and depth < 3:
        inner = b"".join(draw(st.lists(field(depth + 1), max_size=3)))
        end = number if draw(st.integers(0, 9)) else draw(st.integers(1, 9))
        return tag + inner + varint(end << 3 | 4)
    return tag


@st.composite
def hand_written(draw) -> bytes:
    """Fields in any order, repeated, unknown or of another wire type."""
    return b"".join(draw(st.lists(field(), max_size=8)))


@st.composite
def damaged(draw) -> bytes:
    """A request (either kind) cut, with bytes flipped, inserted or removed."""
    data = bytearray(draw(st.one_of(requests(), hand_written())))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["cut", "flip", "insert", "remove"]))
        if kind == "cut":
            del data[draw(st.integers(0, len(data))) :]
        elif kind == "flip" and data:
            at = draw(st.integers(0, len(data) - 1))
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "insert":
            at = draw(st.integers(0, len(data)))
            data[at:at] = draw(st.binary(min_size=1, max_size=3))
        elif data:
            del data[draw(st.integers(0, len(data) - 1))]
    return bytes(data)


def deep_groups(depth: int, number: int = 9) -> bytes:
    """``depth`` groups nested in each other (protobuf's limit is 100 in a request)."""
    return varint(number << 3 | 3) * depth + varint(number << 3 | 4) * depth
