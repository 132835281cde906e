"""Type stub of danube._core.frame, the compiled frame codec (twin of danube._pure.frame)."""

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

from danube._pure.frame import Record as Record

HEADER_SIZE: Final[int]
BODY_FIXED_SIZE: Final[int]
MIN_BODY: Final[int]
MAX_BODY: Final[int]
FLAG_HAS_KEY: Final[int]
SCAN_END: Final[int]
SCAN_ZERO: Final[int]
SCAN_TORN: Final[int]
SCAN_CORRUPT: Final[int]

def crc32c(data: Buffer, value: int = 0) -> int: ...
def crc32c_implementation() -> str: ...
def _crc32c_with(implementation: str, data: Buffer, value: int = 0) -> int: ...
def encode_record(
    payload: Any,
    *,
    offset: int = 0,
    publish_time: int = 0,
    producer_id: int = 0,
    key: str | None = None,
    attributes: Mapping[str, str] | None = None,
) -> bytes: ...
def encode_payloads(
    payloads: Iterable[Any],
    *,
    base_offset: int = 0,
    publish_time: int = 0,
    producer_id: int = 0,
    key: str | None = None,
    attributes: Mapping[str, str] | None = None,
) -> bytes: ...
def encode_records(
    records: Iterable[tuple[int, int, str | None, Mapping[str, str] | None, Any]],
    *,
    base_offset: int = 0,
) -> bytes: ...
def validate(buf: Buffer, expected_first_offset: int = -1, check_sequence: bool = False) -> tuple[int, int, int]: ...
def scan(
    buf: Buffer, start: int = 0, expected_first_offset: int = -1, index_every: int = 0
) -> tuple[int, int, int, int, int, list[tuple[int, int]]]: ...
def stamp_offsets(buf: Buffer, base_offset: int) -> int: ...
def decode_frame(buf: Buffer, pos: int = 0) -> tuple[Record | None, int]: ...
def iter_records(buf: Buffer) -> Iterator[Record]: ...
def decode_batch(buf: Buffer) -> list[Record]: ...
def decode_columns(buf: Buffer) -> dict[str, list[Any]]: ...
def frame_positions(buf: Buffer) -> list[int]: ...
def frames_within(buf: Buffer, max_messages: int, max_bytes: int) -> tuple[int, int]: ...
def find_offset(buf: Buffer, offset: int, start: int = 0) -> int: ...
def routing_keys(buf: Buffer) -> list[str | None]: ...

FIELDS_OK: Final[int]
FIELDS_BAD_LAYOUT: Final[int]
FIELDS_KEY_NOT_UTF8: Final[int]
FIELDS_ATTR_NAME_NOT_UTF8: Final[int]
FIELDS_ATTR_VALUE_NOT_UTF8: Final[int]
FIELDS_WRONG_PRODUCER: Final[int]

def check_fields(buf: Buffer, producer_id: int | None = None) -> tuple[int, int]: ...
