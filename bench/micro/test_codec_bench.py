"""Micro-benchmarks of the frame codec (pytest-benchmark).

    python -m pytest bench/micro --benchmark-only

Every operation runs on the compiled codec and on its pure-Python twin over the
same batch (one benchmark group per operation and record size), so the speedup
is a ratio measured in the same run.  ``extra_info`` holds records/s and GB/s
from the fastest round.
"""

from __future__ import annotations

import os

import pytest

import danube._pure.frame as pure

try:
    import danube._core.frame as compiled
except ImportError:  # pragma: no cover - benchmarks need the build
    compiled = None

IMPLS = [
    pytest.param(
        compiled, id="compiled", marks=pytest.mark.skipif(compiled is None, reason="danube._core.frame not built")
    ),
    pytest.param(pure, id="pure"),
]
SIZES = [100, 1024]
BATCH_BYTES = 1 << 20  # about 1 MiB of payload per batch


def _payloads(size: int) -> list[bytes]:
    return [os.urandom(size) for _ in range(BATCH_BYTES // size)]


@pytest.fixture(scope="module", params=SIZES, ids=lambda s: f"{s}B")
def workload(request):
    payloads = _payloads(request.param)
    batch = pure.encode_payloads(payloads, publish_time=1_700_000_000_000, producer_id=7)
    return request.param, payloads, batch


def _record_rates(benchmark, records: int, nbytes: int) -> None:
    best = benchmark.stats.stats.min
    benchmark.extra_info["records_per_s"] = round(records / best)
    benchmark.extra_info["GB_per_s"] = round(nbytes / best / 1e9, 3)


def _slow_rounds(benchmark, impl, call):
    """The pure twin takes whole seconds on a 1 MiB batch: a few rounds suffice."""
    if impl is pure:
        return benchmark.pedantic(call, rounds=3, iterations=1)
    return benchmark(call)


@pytest.mark.parametrize("impl", IMPLS)
def test_encode_payloads(benchmark, impl, workload):
    size, payloads, batch = workload
    benchmark.group = f"encode_payloads {size}B"
    out = _slow_rounds(
        benchmark, impl, lambda: impl.encode_payloads(payloads, publish_time=1_700_000_000_000, producer_id=7)
    )
    assert out == batch
    _record_rates(benchmark, len(payloads), len(batch))


@pytest.mark.parametrize("impl", IMPLS)
def test_validate(benchmark, impl, workload):
    size, payloads, batch = workload
    benchmark.group = f"validate {size}B"
    assert _slow_rounds(benchmark, impl, lambda: impl.validate(batch, 0, True))[0] == len(payloads)
    _record_rates(benchmark, len(payloads), len(batch))


@pytest.mark.parametrize("impl", IMPLS)
def test_decode_batch(benchmark, impl, workload):
    size, payloads, batch = workload
    benchmark.group = f"decode_batch {size}B"
    assert len(_slow_rounds(benchmark, impl, lambda: impl.decode_batch(batch))) == len(payloads)
    _record_rates(benchmark, len(payloads), len(batch))


@pytest.mark.parametrize("impl", IMPLS)
def test_crc32c(benchmark, impl, workload):
    size, payloads, batch = workload
    benchmark.group = f"crc32c {size}B-record batch"
    assert _slow_rounds(benchmark, impl, lambda: impl.crc32c(batch)) == pure.crc32c(batch) or impl is pure
    _record_rates(benchmark, len(payloads), len(batch))


@pytest.mark.parametrize("impl", IMPLS)
def test_stamp_offsets(benchmark, impl, workload):
    size, payloads, batch = workload
    benchmark.group = f"stamp_offsets {size}B"
    writable = bytearray(batch)
    assert _slow_rounds(benchmark, impl, lambda: impl.stamp_offsets(writable, 1000)) == len(payloads)
    _record_rates(benchmark, len(payloads), len(batch))


@pytest.mark.skipif(compiled is None, reason="danube._core.frame not built")
@pytest.mark.parametrize("implementation", ["sse4.2", "slicing-by-8"])
def test_crc32c_implementations(benchmark, implementation):
    if implementation == "sse4.2" and compiled.crc32c_implementation() != "sse4.2":
        pytest.skip("no SSE4.2 path on this CPU")
    data = os.urandom(BATCH_BYTES)
    benchmark.group = "crc32c 1 MiB by implementation"
    benchmark(compiled._crc32c_with, implementation, data)
    _record_rates(benchmark, 1, len(data))
