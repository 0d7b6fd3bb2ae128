"""TLS on the ext_proc port: a given certificate, or a self-signed one made at start.

Upstream (gie-epp.md §1.2, `pkg/epp/server/runserver.go`): `--secure-serving` (default
true there) serves the ext_proc port over TLS with the certificate in `--cert-path`
(`tls.crt` and `tls.key`, the layout of a mounted `kubernetes.io/tls` Secret), or, when
no path is given, a self-signed one created at start; gateways connect without verifying
it. Here the default is plaintext (docs/ARCHITECTURE.md "TLS" says why) and
`--secure-serving` / `--cert-path DIR` turn TLS on. The gRPC health port stays plaintext
in both cases, as upstream's separate health server: the kubelet's gRPC probe cannot
speak TLS.

The self-signed certificate is ECDSA P-256 (cheap handshakes), valid one year, with the
host's name, `localhost` and 127.0.0.1 as subject alternative names; it only encrypts
(nobody can verify it), which is what upstream's default gives too.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path

CERT_FILE, KEY_FILE = "tls.crt", "tls.key"


class TlsError(ValueError):
    """A certificate that cannot be used; the message names the file and the fix."""


@dataclass(frozen=True, slots=True)
class ServerCert:
    cert_pem: bytes
    key_pem: bytes
    source: str  # where it came from, for the log line
    # --cert-path with reload on: the directory to re-read when its files change
    # (epp/extproc/cert_reload.py); None: this certificate for the server's lifetime.
    reload_dir: str | None = None


def load_cert_dir(path: str | Path) -> ServerCert:
    """`tls.crt` + `tls.key` from `path` (--cert-path); TlsError naming what is wrong."""
    d = Path(path)
    if not d.is_dir():
        raise TlsError(f"--cert-path {d}: not a directory (expected {CERT_FILE} and {KEY_FILE})")
    try:
        cert, key = (d / CERT_FILE).read_bytes(), (d / KEY_FILE).read_bytes()
    except OSError as e:
        raise TlsError(
            f"--cert-path {d}: cannot read {Path(e.filename).name}: {e.strerror}"
        ) from None
    if b"-----BEGIN CERTIFICATE-----" not in cert:
        raise TlsError(f"--cert-path {d}: {CERT_FILE} is not a PEM certificate")
    if b"PRIVATE KEY-----" not in key:
        raise TlsError(f"--cert-path {d}: {KEY_FILE} is not a PEM private key")
    _check_pair(cert, key, d)
    return ServerCert(cert, key, str(d))


def _check_pair(cert_pem: bytes, key_pem: bytes, where: Path) -> None:
    """The key must be the certificate's: gRPC would only fail at the first handshake."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as e:
        raise TlsError(f"--cert-path {where}: {e}") from None
    pub = serialization.PublicFormat.SubjectPublicKeyInfo
    enc = serialization.Encoding.DER
    if cert.public_key().public_bytes(enc, pub) != key.public_key().public_bytes(enc, pub):
        raise TlsError(f"--cert-path {where}: {KEY_FILE} is not the key of {CERT_FILE}")


def self_signed(hosts: tuple[str, ...] = ()) -> ServerCert:
    """A fresh self-signed certificate for this host (and `hosts`)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for h in (socket.gethostname(), "localhost", "127.0.0.1", *hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "epp")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(key, hashes.SHA256())
    )
    return ServerCert(
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        "self-signed",
    )


def server_credentials(cert: ServerCert):  # -> grpc.ServerCredentials
    import grpc

    return grpc.ssl_server_credentials([(cert.key_pem, cert.cert_pem)])
