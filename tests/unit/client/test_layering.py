"""The client stands on the codec, the protocol stubs and the shared error table, never on the
broker's side (docs/internals.md): importing it loads nothing of the server, broker or storage."""

from __future__ import annotations

import subprocess
import sys

SERVER_SIDE = (
    "danube.server",
    "danube.broker",
    "danube.storage",
    "danube.wal",
    "danube.cluster",
    "danube.metadata",
    "danube.schema.registry",
    "danube.schema.validation",
)


def test_importing_the_client_loads_nothing_of_the_server_side():
    code = "import sys, danube.client; print('\\n'.join(sorted(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    wrong = [m for m in loaded if m.startswith(SERVER_SIDE)]
    assert wrong == [], f"danube.client imports the server side: {wrong}"
    assert "danube.status_codes" in loaded  # the table it maps status codes with
