"""`danube broker --config` with a wrong file: no broker starts, the exit status is 2 and the log
names the bad key in a sentence (every other wrong key or value: tests/unit/test_settings.py)."""

from __future__ import annotations

import subprocess
import sys

DANUBE = [sys.executable, "-m", "danube.cli.main"]


def test_a_bad_config_file_stops_the_broker_with_a_sentence(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("sync: interval\nhttp2:\n  max_frame_sizee: 65536\n")
    done = subprocess.run(
        [*DANUBE, "broker", "--config", str(path), "--data-dir", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, (done.returncode, done.stderr)
    sentence = "bad configuration: unknown key http2.max_frame_sizee: not a setting (did you mean max_frame_size?)"
    assert sentence in done.stderr, done.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was created
