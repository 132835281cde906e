# C-level contract of danube._core.frame, for other Cython modules (walfile, ring,
# arrowcols).
#
# Byte layout: the comment block at the top of danube/_pure/frame.py (the one
# description); below, the same sizes and field positions as C constants, for
# every compiled module that reads or writes frames (with the loads and stores of
# le.pxd).  Everything here works on raw pointers and never
# touches Python objects, so it may run without the GIL; the caller keeps the
# buffer alive (hold a Py_buffer or a memoryview) and checks n >= 0.
#
#     from danube._core.frame cimport crc32c_update, scan_frames, ScanResult
#
# The functions are exported through the module's C-API capsule, so cimporting
# modules need not link crc32c_impl.c themselves.

cimport cython
from libc.stdint cimport uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

from danube._core.le cimport st16, st32, st64

# Sizes and field positions of the layout (described byte by byte at the top of
# danube/_pure/frame.py); every compiled module reads and writes frames with these.
cdef enum:
    FRAME_HEADER_SIZE = 16
    FRAME_BODY_FIXED_SIZE = 22
    FRAME_FIXED_SIZE = 38           # header + fixed body part: where the routing key starts
    FRAME_MIN_BODY = 22
    FRAME_MAX_BODY = 268435456      # 256 MiB
    # header fields, from the frame's first byte
    FRAME_OFFSET_AT = 0             # u64
    FRAME_CRC_AT = 8                # u32, CRC32C of [FRAME_BODY_LEN_AT, end of body)
    FRAME_BODY_LEN_AT = 12          # u32
    # body fields, from the body's first byte (frame + FRAME_HEADER_SIZE)
    BODY_PUBLISH_TIME_AT = 0        # u64
    BODY_PRODUCER_ID_AT = 8         # u64
    BODY_FLAGS_AT = 16              # u8
    BODY_RESERVED_AT = 17           # u8, 0
    BODY_ATTR_COUNT_AT = 18         # u16
    BODY_KEY_LEN_AT = 20            # u16
    FRAME_FLAG_HAS_KEY = 0x01       # the only flag bit

# Outcome of check_frame / validate_frames / stamp_frames.
cdef enum:
    FRAME_OK = 0
    FRAME_TORN = 1                  # the buffer ends inside the frame (need more bytes)
    FRAME_BAD_LENGTH = 2            # body_len outside [MIN_BODY, MAX_BODY]
    FRAME_BAD_CRC = 3
    FRAME_BAD_FLAGS = 4             # unknown flag bits or reserved byte set
    FRAME_KEY_WITHOUT_FLAG = 5
    FRAME_KEY_OVERRUN = 6
    FRAME_ATTRS_OVERRUN = 7
    FRAME_BAD_FIRST_OFFSET = 8      # validate: first offset is not the expected one
    FRAME_BAD_SEQUENCE = 9          # validate: offsets not consecutive
    FRAME_NO_MEMORY = 10            # scan: the index could not grow
    FRAME_OFFSET_OVERFLOW = 11      # stamp: base + count - 1 exceeds the u64 range

# The header fields of the frame last looked at.
cdef struct FrameInfo:
    uint64_t offset
    uint32_t stored_crc
    uint32_t actual_crc             # valid once the checksum was computed
    uint32_t body_len

cdef struct ValidateResult:
    Py_ssize_t count                # whole valid frames before the failure (or all)
    uint64_t first                  # offsets of the first/last valid frame (count > 0)
    uint64_t last
    Py_ssize_t error_pos            # byte position of the failing frame
    FrameInfo info                  # its header

cdef struct ScanResult:
    Py_ssize_t count
    Py_ssize_t end_pos              # end of the last whole valid frame
    uint64_t first
    uint64_t last
    int reason                      # SCAN_END / SCAN_ZERO / SCAN_TORN / SCAN_CORRUPT (0..3)

cdef struct IndexEntry:
    uint64_t offset
    Py_ssize_t position

# One record to encode: the body's fixed fields, key, attribute section (already
# encoded: u16 name_len, name, u32 value_len, value per attribute) and payload.
# The pointers are the caller's; write_frame only reads them.
cdef struct Piece:
    uint64_t publish_time
    uint64_t producer_id
    const unsigned char* key
    Py_ssize_t key_len
    const unsigned char* attrs
    Py_ssize_t attrs_len
    const unsigned char* payload
    Py_ssize_t payload_len
    uint16_t attr_count
    unsigned char flags             # FRAME_FLAG_HAS_KEY or 0

# CRC32C of p[0:n] continuing crc (0 to start): hardware or slicing-by-8.
cdef uint32_t crc32c_update(uint32_t crc, const unsigned char* p, size_t n) noexcept nogil

# Checks the frame at pos (length, checksum, body layout); fills info.
# Returns FRAME_OK, FRAME_TORN or a corruption status.
cdef int check_frame(const unsigned char* buf, Py_ssize_t n, Py_ssize_t pos,
                     FrameInfo* info) noexcept nogil

# validate() as one loop.  expect_first: 0 = no expectation, 1 = first offset must be
# expected_first, 2 = no u64 can match.  Returns FRAME_OK or the failure status
# (FRAME_TORN means the batch ends inside a frame); out says where.
cdef int validate_frames(const unsigned char* buf, Py_ssize_t n, int expect_first,
                         uint64_t expected_first, bint check_sequence,
                         ValidateResult* out) noexcept nogil

# Raises the exception danube._pure.frame would raise for a validate failure
# (expected_first_offset only feeds the message).
cdef int raise_validate_error(int status, const ValidateResult* res,
                              object expected_first_offset) except -1

# Raises the CorruptFrameError / FrameFormatError matching a check_frame status.
cdef int raise_frame_error(int status, Py_ssize_t pos, const FrameInfo* info) except -1

# scan() as one loop: whole valid frames with consecutive offsets from start.
# When index is not NULL, *index receives a malloc'd array (caller frees) of
# *index_len entries: the first frame, then one whenever >= index_every bytes
# passed (index_every 0 = first frame only).  Returns out.count, or -1 when
# the index could not be allocated (nothing to free then).
cdef Py_ssize_t scan_frames(const unsigned char* buf, Py_ssize_t n, Py_ssize_t start,
                            int expect_first, uint64_t expected_first,
                            Py_ssize_t index_every, ScanResult* out,
                            IndexEntry** index, Py_ssize_t* index_len) noexcept nogil

# Writes base, base+1, ... into the headers of a batch after checking every
# length first (nothing is written on failure).  Returns FRAME_OK, FRAME_TORN
# (the batch ends inside a header), FRAME_BAD_LENGTH (*error_pos / *error_len
# say where) or FRAME_OFFSET_OVERFLOW; *count is the number of frames.
cdef int stamp_frames(unsigned char* buf, Py_ssize_t n, uint64_t base, Py_ssize_t* count,
                      Py_ssize_t* error_pos, uint32_t* error_len) noexcept nogil

# Body length of a piece (the caller checks it is <= FRAME_MAX_BODY).
cdef inline Py_ssize_t piece_body_len(const Piece* piece) noexcept nogil:
    return FRAME_BODY_FIXED_SIZE + piece.key_len + piece.attrs_len + piece.payload_len

# Encodes one whole frame of the piece at out, which has room for
# FRAME_HEADER_SIZE + piece_body_len(piece) bytes, checksum included; returns its size.
# The only frame encoder: the codec's encode_* and the WAL writer both use it (inline,
# so the WAL's per-record path stores straight into its mapping).
cdef inline Py_ssize_t write_frame(unsigned char* out, uint64_t offset, const Piece* piece) noexcept nogil:
    cdef uint32_t body_len = <uint32_t>piece_body_len(piece)
    cdef unsigned char* p = out + FRAME_HEADER_SIZE
    st64(out + FRAME_OFFSET_AT, offset)
    st32(out + FRAME_BODY_LEN_AT, body_len)
    st64(p + BODY_PUBLISH_TIME_AT, piece.publish_time)
    st64(p + BODY_PRODUCER_ID_AT, piece.producer_id)
    p[BODY_FLAGS_AT] = piece.flags
    p[BODY_RESERVED_AT] = 0
    st16(p + BODY_ATTR_COUNT_AT, piece.attr_count)
    st16(p + BODY_KEY_LEN_AT, <uint16_t>piece.key_len)
    p += FRAME_BODY_FIXED_SIZE
    if piece.key_len:
        memcpy(p, piece.key, piece.key_len)
        p += piece.key_len
    if piece.attrs_len:
        memcpy(p, piece.attrs, piece.attrs_len)
        p += piece.attrs_len
    memcpy(p, piece.payload, piece.payload_len)
    st32(out + FRAME_CRC_AT, crc32c_update(0, out + FRAME_BODY_LEN_AT, 4 + <size_t>body_len))
    return FRAME_HEADER_SIZE + body_len

# Outcome of check_fields_frames: what a subscriber needs of a frame beyond its checksum.
cdef enum:
    FIELDS_OK_STATUS = 0
    FIELDS_BAD_LAYOUT_STATUS = 1            # lengths or flags do not hold together
    FIELDS_KEY_NOT_UTF8_STATUS = 2
    FIELDS_ATTR_NAME_NOT_UTF8_STATUS = 3
    FIELDS_ATTR_VALUE_NOT_UTF8_STATUS = 4
    FIELDS_WRONG_PRODUCER_STATUS = 5        # the frame's producer id is not the expected one

# Checks every frame of a batch: layout, then (with check_producer) the producer id (it must
# be producer_id or 0, the encoders' "not set"), then
# routing key, attribute names and values as UTF-8 exactly as bytes.decode("utf-8")
# accepts them.  Checksums are not checked.  Returns FIELDS_OK_STATUS (*error_pos = -1)
# or the first failure; *error_pos is then the failing frame's position.
cdef int check_fields_frames(const unsigned char* buf, Py_ssize_t n, bint check_producer,
                             uint64_t producer_id, Py_ssize_t* error_pos) noexcept nogil


# A writable copy of a producer's batch that check_batch (danube/_core/frame.pyx) made after
# checking it whole: lengths, checksums and layout as validate checks them, and the fields a
# subscriber decodes as check_fields checks them for producer_id.  Only check_batch (and
# checked_copy, below) makes one
# (its constructor always refuses; check_batch allocates it bare, which its C-only fields
# allow); the WAL writer appends it without validating its frames again while its length is
# still nbytes (contract: check_batch's docstring).
@cython.final
cdef class CheckedFrames(bytearray):
    cdef readonly Py_ssize_t frame_count       # frames (not `count`: bytearray.count stays)
    cdef readonly Py_ssize_t nbytes            # the length checked
    cdef readonly uint64_t producer_id         # the id the fields were checked for
    cdef readonly Py_ssize_t fields_position   # check_fields' result for that id
    cdef readonly int fields_problem

# check_batch's copy of n bytes at buf for producer_id without raising: the CheckedFrames, or
# None when a length, checksum or layout is bad (check_batch of the same bytes raises then).
# For a reader that meets a batch inside a bigger buffer (publish_request.parse): one copy.
# Unlike the rest of this file it makes a Python object: it needs the GIL.
cdef object checked_copy(const unsigned char* buf, Py_ssize_t n, uint64_t producer_id)
