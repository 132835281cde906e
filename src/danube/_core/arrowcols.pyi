from typing import Any

def decode_arrow_buffers(buf: Any) -> dict[str, Any]:
    """Arrow column buffers of a whole frame batch: count, offset, publish_us, producer_id,
    key_validity, key_nulls, key_offsets, key_data, attr_offsets, name_offsets, name_data,
    value_offsets, value_data, payload_offsets, payload_data."""
