"""A real S3 HTTP endpoint for tests: moto's ThreadedMotoServer on 127.0.0.1 and a free port.

    with moto_s3(bucket="danube-test") as s3:
        s3.endpoint, s3.bucket, s3.access_key, s3.secret_key, s3.client()

The server is stopped when the block ends, also when it fails.  ``pytest``
fixtures ``s3_server`` (session) and ``s3_bucket`` (a fresh bucket per test)
wrap it.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass
from typing import Iterator

from tests.support.ports import free_port, wait_for_port

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"
_bucket_ids = itertools.count(1)


@dataclass
class S3Endpoint:
    endpoint: str
    bucket: str
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    region: str = REGION

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def create_bucket(self, bucket: str | None = None) -> "S3Endpoint":
        """A fresh bucket on the same server."""
        name = bucket or f"danube-test-{next(_bucket_ids)}"
        self.client().create_bucket(Bucket=name)
        return S3Endpoint(self.endpoint, name, self.access_key, self.secret_key, self.region)

    def storage_section(self, prefix: str = "danube") -> dict:
        """The ``storage.durable`` YAML section pointing at this bucket."""
        return {
            "backend": "s3",
            "root": f"{self.bucket}/{prefix}" if prefix else self.bucket,
            "endpoint": self.endpoint,
            "region": self.region,
            "access_key": self.access_key,
            "secret_key": self.secret_key,
        }


@contextlib.contextmanager
def moto_s3(bucket: str = "danube-test") -> Iterator[S3Endpoint]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        wait_for_port(port, timeout=30)
        endpoint = S3Endpoint(f"http://127.0.0.1:{port}", bucket)
        endpoint.client().create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        server.stop()


def _fixtures():
    import pytest

    @pytest.fixture(scope="session")
    def s3_server():
        with moto_s3() as endpoint:
            yield endpoint

    @pytest.fixture
    def s3_bucket(s3_server):
        return s3_server.create_bucket()

    return s3_server, s3_bucket


# Import into a conftest.py: ``from tests.support.s3 import s3_server, s3_bucket`` (with noqa F401)
s3_server, s3_bucket = _fixtures()
