"""The pure-Python twins stand on their own, as the compiled modules' stand-ins.

CI runs the unit suite a second time with ``DANUBE_NO_EXTENSIONS=1`` (as aiokafka
runs its suite with ``AIOKAFKA_NO_EXTENSIONS``), which tests the twins through every
layer above them; these tests check what that run cannot see: that a twin never
reaches for the compiled core itself, and that each twin offers the compiled
module's public names.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

TWINS = ["frame", "ring", "walfile", "arrowcols", "avrocheck", "h2codec", "pbwire", "publish_request"]


def test_twins_import_no_compiled_module():
    # a fresh interpreter with the compiled core available (not forced off): importing
    # the twins must still load neither danube._core nor danube.message_codec (which would
    # pick the compiled codec)
    env = {k: v for k, v in os.environ.items() if k != "DANUBE_NO_EXTENSIONS"}
    code = (
        "import sys\n"
        + "".join(f"import danube._pure.{name}\n" for name in TWINS)
        + "print(' '.join(sorted(m for m in sys.modules if m.startswith('danube._core')"
        " or m in ('danube.message_codec', 'danube._native'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == []


@pytest.mark.parametrize("name", TWINS)
def test_twin_offers_the_compiled_names(name):
    try:
        compiled = importlib.import_module(f"danube._core.{name}")
    except ImportError:
        pytest.skip(f"danube._core.{name} not built")
    pure = importlib.import_module(f"danube._pure.{name}")
    public = {n for n in dir(compiled) if not n.startswith("_")}
    # what the compiled module defines (not the modules, classes and functions it imported)
    exported = {
        n
        for n in public
        if not isinstance(getattr(compiled, n), type(sys))
        and getattr(getattr(compiled, n), "__module__", compiled.__name__) == compiled.__name__
    }
    missing = sorted(n for n in exported if not hasattr(pure, n))
    assert missing == []


def test_walfile_twin_is_split_as_the_compiled_module():
    from danube._pure import walfile
    from danube._pure.wal import segment, writer

    assert walfile.SegmentFile is segment.SegmentFile
    assert walfile.LogWriter is writer.LogWriter
    assert writer.SegmentFile is segment.SegmentFile
