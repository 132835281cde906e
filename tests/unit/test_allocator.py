"""danube/_allocator.py: each case in a fresh process, since the thresholds are per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")

# mallinfo2's hblkhd: bytes in blocks malloc got from mmap.  A 4 MiB block is above glibc's
# default threshold (128 KiB, raised only by freeing larger mmap'd blocks) and below ours.
PROBE = """
import ctypes, json, sys
from danube import _allocator
libc = ctypes.CDLL("libc.so.6")
if not hasattr(libc, "mallinfo2"):
    print(json.dumps({"skip": "no mallinfo2"})); sys.exit()
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                               "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = MallInfo2
said = _allocator.tune() if sys.argv[1] == "tune" else _allocator.described()
before = libc.mallinfo2().hblkhd
block = bytearray(4 << 20)
print(json.dumps({"said": said, "mmapped": libc.mallinfo2().hblkhd - before, "described": _allocator.described()}))
"""


def probe(mode: str, **env: str) -> dict:
    full_env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "DANUBE_MALLOC_TUNING")}
    full_env.update(env)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=full_env, timeout=60, check=True
    )
    result = json.loads(out.stdout)
    if "skip" in result:
        pytest.skip(result["skip"])
    return result


def test_tuned_process_keeps_a_4_mib_block_on_the_heap():
    untuned = probe("none")
    assert untuned["mmapped"] >= 4 << 20  # the control: glibc's default maps it
    assert "not tuned" in untuned["said"]
    tuned = probe("tune")
    assert tuned["said"] == "glibc malloc: mmap_threshold 16 MiB, trim_threshold 64 MiB"
    assert tuned["described"] == tuned["said"]
    assert tuned["mmapped"] == 0


def test_opt_out_and_the_users_own_tunables_are_respected():
    opted_out = probe("tune", DANUBE_MALLOC_TUNING="0")
    assert opted_out["said"] == "glibc malloc defaults (DANUBE_MALLOC_TUNING=0)"
    assert opted_out["mmapped"] >= 4 << 20
    own = probe("tune", GLIBC_TUNABLES="glibc.malloc.mmap_threshold=8388608")
    assert own["said"] == "glibc malloc as set by GLIBC_TUNABLES"
    assert own["mmapped"] == 0  # the user's 8 MiB threshold, applied by glibc itself
