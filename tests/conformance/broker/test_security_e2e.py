"""danube-broker/tests/security_e2e.rs, test for test (client side: client/security_e2e.py).

Danube runs it against a broker with TLS and JWT after its security workflow created the roles
and bindings; here the same is done by the fixture: a broker with TLS (certificates made in the
test) and JWT, a producer role (produce, lookup) and a consumer role (consume, lookup) bound to
the authorized principal on the test topic through ``danube admin security``, and a principal
with no bindings.  The three tests run in one client subprocess, in order.
"""

import os
import subprocess
import sys

import pytest

from danube.security.jwt import issue_token
from tests.conformance.broker import harness
from tests.support.broker import running_broker
from tests.support.certs import make_pki

pytestmark = pytest.mark.timeout(400)

SECRET = "conformance-secret-0123456789abcdef-0123"
TOPIC = "/default/security-test"


class _Target:
    def __init__(self, broker):
        self.url = f"https://127.0.0.1:{broker.port}"
        self.admin_url = f"https://127.0.0.1:{broker.admin_port}"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    pki = make_pki(str(tmp_path_factory.mktemp("pki")))
    secret = tmp_path_factory.mktemp("secret") / "jwt-secret"
    secret.write_text(SECRET)
    os.chmod(secret, 0o600)
    with running_broker(
        "--tls-cert",
        pki.server.cert,
        "--tls-key",
        pki.server.key,
        "--jwt-secret-file",
        str(secret),
        "--super-admin",
        "ops",
    ) as broker:

        def admin(*args):
            cmd = [
                sys.executable,
                "-m",
                "danube.cli.main",
                "admin",
                "--endpoint",
                f"127.0.0.1:{broker.admin_port}",
                "--tls-ca",
                pki.ca,
                "--token",
                issue_token("ops", SECRET),
                "--timeout",
                "20",
                "security",
                *args,
            ]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, f"{args}: {done.stderr}"

        admin("roles", "create", "producer-role", "--permission", f"produce:{TOPIC}", "--permission", f"lookup:{TOPIC}")
        admin("roles", "create", "consumer-role", "--permission", f"consume:{TOPIC}", "--permission", f"lookup:{TOPIC}")
        for role in ("producer-role", "consumer-role"):
            admin("bindings", "create", "--subject", "e2e-authorized", "--role", role)
        yield harness.run(
            "security_e2e",
            _Target(broker),
            parallel=1,
            env={
                "DANUBE_CA_CERT": pki.ca,
                "DANUBE_AUTHORIZED_TOKEN": issue_token("e2e-authorized", SECRET),
                "DANUBE_DENIED_TOKEN": issue_token("e2e-denied", SECRET),
            },
        )


def test_security_authorized_produce(results):
    results.check("security_authorized_produce")


def test_security_authorized_consume(results):
    results.check("security_authorized_consume")


def test_security_denied_produce(results):
    results.check("security_denied_produce")
