# C-level contract of danube._core.h2codec (HTTP/2 frames and gRPC length-prefixed messages).
# Byte layouts: the comment block at the top of h2codec.pyx; semantics: the pure twin,
# danube/_pure/h2codec.py.

cdef enum:
    H2_HEADER_SIZE = 9       # an HTTP/2 frame header
    GRPC_PREFIX_SIZE = 5     # a gRPC message's flag byte and length


# Appends (type, flags, stream id, payload bytes) to out for every whole frame at the start of
# buf[:n], within the three budgets (frames, HEADERS frames, header block bytes); returns the
# bytes they took.  Raises FrameError(FRAME_SIZE_ERROR) for a length over max_frame_size.
cdef Py_ssize_t split_frames(const unsigned char* buf, Py_ssize_t n, Py_ssize_t max_frame_size,
                             long long max_frames, long long max_headers, long long max_header_bytes,
                             list out) except -1

# Appends every whole message at the start of buf[:n] to out as bytes; returns the bytes they
# took.  Raises CompressedMessage or MessageTooLarge as soon as a prefix shows either.
cdef Py_ssize_t split_messages(const unsigned char* buf, Py_ssize_t n, Py_ssize_t limit, list out) except -1

# OverflowError unless 0 <= length <= 2^24-1 (what a frame header can carry).
cdef int check_length(Py_ssize_t length) except -1


cdef class MessageReader:
    cdef bytearray _buffer             # the unfinished message's bytes (empty when pending == 0)
    cdef Py_ssize_t _limit             # the largest message length accepted
    cdef readonly Py_ssize_t pending   # len(_buffer)
