"""Throwaway TLS material for tests of stores over TLS: a CA, a server and a client certificate."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["make_certificates"]

_Issuer = tuple[x509.Name, ec.EllipticCurvePrivateKey]


def make_certificates(directory: Path) -> dict[str, Path]:
    """PEM files in directory: ca, server (for 127.0.0.1), client (signed by ca), other-ca,
    and other-client (signed by other-ca: a well-formed client certificate the server refuses).

    The keys of the result are file names: ``ca.crt``, ``server.crt``,
    ``server.key``, ``client.crt``, ``client.key``, ``other-ca.crt``,
    ``other-client.crt``, ``other-client.key``, ...
    """
    now = datetime.datetime.now(datetime.UTC)
    paths: dict[str, Path] = {}

    def issue(name: str, issuer: _Issuer | None, ip: str = "") -> _Issuer:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        issuer_name, issuer_key = issuer or (subject, key)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), True)
        )
        if ip:
            san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))])
            builder = builder.add_extension(san, False)
        cert = builder.sign(issuer_key, hashes.SHA256())
        for suffix, data in (
            ("crt", cert.public_bytes(serialization.Encoding.PEM)),
            (
                "key",
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                ),
            ),
        ):
            paths[f"{name}.{suffix}"] = directory / f"{name}.{suffix}"
            paths[f"{name}.{suffix}"].write_bytes(data)
        return subject, key

    ca = issue("ca", None)
    issue("server", ca, ip="127.0.0.1")
    issue("client", ca)
    other_ca = issue("other-ca", None)
    issue("other-client", other_ca)
    return paths
