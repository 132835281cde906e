"""Certificates made in the test with ``cryptography``: a CA, a server certificate for
127.0.0.1/localhost, client certificates, and a second CA nobody trusts."""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass
class Pair:
    cert: str
    key: str


@dataclass
class Pki:
    ca: str
    server: Pair
    client: Pair  # CN=client-1, signed by ca
    other_ca: str  # a CA that signed nothing the broker trusts
    rogue_client: Pair  # CN=client-1, signed by other_ca


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: str, data: bytes, mode: int = 0o600) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)
    return path


def _key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _ca(cn: str):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(ca_cert, ca_key, cn: str, *, usages: list, san: bool):
    """A certificate for ``cn`` signed by the CA, for the extended key ``usages``; ``san``: valid for
    localhost and 127.0.0.1."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    if san:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return builder.sign(ca_key, hashes.SHA256()), key


def _pair(directory: str, name: str, ca_cert, ca_key, cn: str, *, usages: list, san: bool) -> "Pair":
    cert, key = _leaf(ca_cert, ca_key, cn, usages=usages, san=san)
    return Pair(
        _write(os.path.join(directory, f"{name}.pem"), cert.public_bytes(serialization.Encoding.PEM), 0o644),
        _write(os.path.join(directory, f"{name}-key.pem"), _key_pem(key)),
    )


def make_pki(directory: str, client_cn: str = "client-1") -> Pki:
    os.makedirs(directory, exist_ok=True)
    pem = serialization.Encoding.PEM
    ca_cert, ca_key = _ca("danube test CA")
    other_cert, other_key = _ca("untrusted CA")
    ca = _write(os.path.join(directory, "ca.pem"), ca_cert.public_bytes(pem), 0o644)
    other = _write(os.path.join(directory, "other-ca.pem"), other_cert.public_bytes(pem), 0o644)

    def pair(name, issuer_cert, issuer_key, cn, server):
        usages = [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
        return _pair(directory, name, issuer_cert, issuer_key, cn, usages=usages, san=server)

    return Pki(
        ca=ca,
        server=pair("server", ca_cert, ca_key, "localhost", True),
        client=pair("client", ca_cert, ca_key, client_cn, False),
        other_ca=other,
        rogue_client=pair("rogue", other_cert, other_key, client_cn, False),
    )


@dataclass
class ClusterPki:
    ca: str
    broker: Pair  # every broker's certificate: served, and presented to peers under mTLS
    client: Pair  # CN=client-1 (client authentication only)
    other_ca: str  # a CA that signed nothing the brokers trust


def make_cluster_pki(directory: str, broker_cn: str = "danube-node", client_cn: str = "client-1") -> ClusterPki:
    """Certificates for a secure cluster: the brokers' certificate allows server and client
    authentication (a broker presents it when it calls another broker over mTLS), with SANs
    127.0.0.1 and localhost."""
    os.makedirs(directory, exist_ok=True)
    pem = serialization.Encoding.PEM
    ca_cert, ca_key = _ca("danube cluster CA")
    other_cert, _ = _ca("untrusted CA")
    ca = _write(os.path.join(directory, "ca.pem"), ca_cert.public_bytes(pem), 0o644)
    other = _write(os.path.join(directory, "other-ca.pem"), other_cert.public_bytes(pem), 0o644)

    def pair(name: str, cn: str, usages: list, san: bool) -> Pair:
        return _pair(directory, name, ca_cert, ca_key, cn, usages=usages, san=san)

    return ClusterPki(
        ca=ca,
        broker=pair("broker", broker_cn, [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH], True),
        client=pair("client", client_cn, [ExtendedKeyUsageOID.CLIENT_AUTH], False),
        other_ca=other,
    )
