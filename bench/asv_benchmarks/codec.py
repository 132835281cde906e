"""Frame codec benchmarks: the compiled codec, its pure twin, and speedup ratios."""

from __future__ import annotations

import os
import timeit

import danube._pure.frame as pure

try:
    import danube._core.frame as compiled
except ImportError:  # asv reports the benchmarks as failed rather than the suite as broken
    compiled = None

BATCH_BYTES = 1 << 20


def _batch(size: int):
    payloads = [os.urandom(size) for _ in range(BATCH_BYTES // size)]
    return payloads, pure.encode_payloads(payloads, publish_time=1_700_000_000_000, producer_id=7)


def _best(call, number: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=5)) / number


class CompiledCodec:
    """Time per 1 MiB batch of 100 B or 1 KiB records."""

    params = [100, 1024]
    param_names = ["record_bytes"]

    def setup(self, size):
        if compiled is None:
            raise NotImplementedError("danube._core.frame is not built")
        self.payloads, self.batch = _batch(size)
        self.writable = bytearray(self.batch)

    def time_encode_payloads(self, size):
        compiled.encode_payloads(self.payloads, publish_time=1_700_000_000_000, producer_id=7)

    def time_validate(self, size):
        compiled.validate(self.batch, 0, True)

    def time_scan(self, size):
        compiled.scan(self.batch, 0, 0, 65536)

    def time_decode_batch(self, size):
        compiled.decode_batch(self.batch)

    def time_decode_columns(self, size):
        compiled.decode_columns(self.batch)

    def time_stamp_offsets(self, size):
        compiled.stamp_offsets(self.writable, 1000)

    def time_crc32c(self, size):
        compiled.crc32c(self.batch)


class Throughput:
    """Absolute rates of the compiled codec (records/s, GB/s)."""

    params = [100, 1024]
    param_names = ["record_bytes"]
    timeout = 120

    def setup(self, size):
        if compiled is None:
            raise NotImplementedError("danube._core.frame is not built")
        self.payloads, self.batch = _batch(size)

    def track_encode_records_per_s(self, size):
        return len(self.payloads) / _best(lambda: compiled.encode_payloads(self.payloads), 20)

    track_encode_records_per_s.unit = "records/s"

    def track_validate_gb_per_s(self, size):
        return len(self.batch) / _best(lambda: compiled.validate(self.batch), 50) / 1e9

    track_validate_gb_per_s.unit = "GB/s"

    def track_decode_records_per_s(self, size):
        return len(self.payloads) / _best(lambda: compiled.decode_batch(self.batch), 5)

    track_decode_records_per_s.unit = "records/s"

    def track_crc32c_gb_per_s(self, size):
        return len(self.batch) / _best(lambda: compiled.crc32c(self.batch), 50) / 1e9

    track_crc32c_gb_per_s.unit = "GB/s"


class SpeedupOverPure:
    """Compiled / pure speed on the same 64 KiB batch, measured in the same run."""

    params = [100, 1024]
    param_names = ["record_bytes"]
    timeout = 300

    def setup(self, size):
        if compiled is None:
            raise NotImplementedError("danube._core.frame is not built")
        self.payloads = [os.urandom(size) for _ in range((64 * 1024) // size)]
        self.batch = pure.encode_payloads(self.payloads)

    def _ratio(self, name, *args):
        slow = _best(lambda: getattr(pure, name)(*args), 1)
        fast = _best(lambda: getattr(compiled, name)(*args), 20)
        return slow / fast

    def track_encode_payloads(self, size):
        return self._ratio("encode_payloads", self.payloads)

    track_encode_payloads.unit = "x"

    def track_validate(self, size):
        return self._ratio("validate", self.batch)

    track_validate.unit = "x"

    def track_decode_batch(self, size):
        return self._ratio("decode_batch", self.batch)

    track_decode_batch.unit = "x"
