"""Suite-wide checks: the compiled core must really be in use unless the run opts out."""

from __future__ import annotations

import importlib
import os

import pytest
from hypothesis import HealthCheck, settings

# Property tests check what they generate, not how fast: on 2 shared cores an example can take
# longer than hypothesis's default 200 ms deadline, and a slow data generation trips too_slow.
settings.register_profile("danube", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("danube")

# gRPC's C core registers fork handlers. PySpark starts its JVM with Popen(preexec_fn=...), a real
# fork(): one that lands while another thread of the test process is inside gRPC left the child's
# gRPC restarting its poller on descriptors Popen then closed, and the JVM never started
# (JAVA_GATEWAY_EXITED for every Spark test of a full run). No test forks a process that goes on
# using gRPC, so the handlers are off; set before any test module imports grpc.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# Every compiled module the build produces; the suite fails when one is missing.
COMPILED_MODULES = ["frame", "walfile", "ring", "arrowcols", "avrocheck", "h2codec", "pbwire", "publish_request"]


def pytest_report_header(config):
    forced = os.environ.get("DANUBE_NO_EXTENSIONS", "") not in ("", "0")
    return f"danube extensions: {'forced off (pure-Python twins)' if forced else 'expected (compiled core)'}"


@pytest.fixture(scope="session", autouse=True)
def _compiled_core_really_loaded():
    if os.environ.get("DANUBE_NO_EXTENSIONS", "") not in ("", "0"):
        # the run that tests the twins (ci/test.sh's second run) must really be using them
        from danube import _native, message_codec

        assert message_codec._impl.__name__ == "danube._pure.frame"
        for name in COMPILED_MODULES:
            assert _native.load(name).__name__ == f"danube._pure.{name}"
        yield
        return
    # a module added to the build but not to the list would go unchecked
    core_dir = os.path.join(os.path.dirname(__file__), os.pardir, "src", "danube", "_core")
    if os.path.isdir(core_dir):
        built = {f[: -len(".pyx")] for f in os.listdir(core_dir) if f.endswith(".pyx")}
        assert built == set(COMPILED_MODULES), (
            f"COMPILED_MODULES {sorted(COMPILED_MODULES)} != _core/*.pyx {sorted(built)}"
        )
    missing = []
    for name in COMPILED_MODULES:
        try:
            module = importlib.import_module(f"danube._core.{name}")
        except ImportError as exc:
            missing.append(f"{name}: {exc}")
            continue
        assert module.__file__.endswith((".so", ".pyd")), f"danube._core.{name} is not compiled: {module.__file__}"
    assert not missing, (
        "compiled danube._core modules did not load (build with `pip install -e .` or set "
        "DANUBE_NO_EXTENSIONS=1 to test the pure-Python twins): " + "; ".join(missing)
    )
    import danube.message_codec

    assert danube.message_codec._impl.__name__ == "danube._core.frame"
    yield
