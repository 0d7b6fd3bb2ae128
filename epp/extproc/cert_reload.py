"""`--cert-path` certificates re-read when the files change, without a restart and
without dropping open connections.

Upstream (GIE `--enable-cert-reload`, `pkg/common/certs.go` `CertReloader`, used by
`pkg/epp/server/runserver.go`): an fsnotify watch on the directory, a reload 250 ms after
the last write event, a failed reload keeps the old certificate, and Go's
`tls.Config.GetCertificate` hands the current one to every new handshake. Here the same
behaviour with what Python's gRPC offers: `grpc.dynamic_ssl_server_credentials` asks
`fetch` at every new TLS handshake whether the certificate changed, and `fetch` compares
a stamp of both files (device, inode, size, mtime; `stat` follows symlinks, so the
atomic `..data` swap of a mounted Secret is seen). Established connections keep the
session they negotiated: open ext_proc streams are not touched, new connections get the
new certificate. Handshakes are rare (Envoy keeps its HTTP/2 connections), and an
unchanged stamp costs two `stat` calls.

A rotation caught half-way (the new `tls.crt` beside the old `tls.key`, a file half
written) fails the pair check of `tls.load_cert_dir`: the previous certificate stays in
service, one warning names the problem, and the next handshake after the files change
again retries (no debounce timer is needed: nothing is swapped until the pair is whole).
Counted in `epp_tls_certificate_reloads_total{outcome="loaded"|"failed"}`.

`fetch` runs on a gRPC core thread: it never raises and takes a lock.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import grpc
from prometheus_client import Counter

from epp.extproc.tls import CERT_FILE, KEY_FILE, ServerCert, TlsError, load_cert_dir
from epp.observability import REGISTRY

log = logging.getLogger(__name__)

RELOADS = Counter(
    "epp_tls_certificate_reloads",
    "Changes of the --cert-path files seen at a TLS handshake, by outcome (loaded: now "
    "served; failed: unusable, the previous certificate stays).",
    ["outcome"],
    registry=REGISTRY,
)

Stamp = tuple[tuple[int, int, int, int], ...]


def stamp(directory: Path) -> Stamp | None:
    """(device, inode, size, mtime_ns) of tls.crt and tls.key; None if either is missing."""
    out = []
    for name in (CERT_FILE, KEY_FILE):
        try:
            st = os.stat(directory / name)
        except OSError:
            return None
        out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def _config(cert: ServerCert):  # -> grpc.ServerCertificateConfiguration
    return grpc.ssl_server_certificate_configuration([(cert.key_pem, cert.cert_pem)])


class CertReloader:
    """The certificate of one `--cert-path` directory, current as of the last handshake."""

    def __init__(self, directory: str | Path, initial: ServerCert) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()
        self._current = initial
        self._stamp = stamp(self.directory)  # the files `initial` was read from
        self._failed: Stamp | None = None  # a stamp already found unusable (warned once)

    @property
    def current(self) -> ServerCert:
        return self._current

    def check(self) -> ServerCert | None:
        """The new certificate if the files changed into a usable pair, else None."""
        with self._lock:
            now = stamp(self.directory)
            if now is None or now == self._stamp or now == self._failed:
                return None
            try:
                cert = load_cert_dir(self.directory)
            except TlsError as e:
                self._failed = now
                RELOADS.labels(outcome="failed").inc()
                log.warning("TLS: %s; still serving the previous certificate", e)
                return None
            self._current, self._stamp, self._failed = cert, now, None
        RELOADS.labels(outcome="loaded").inc()
        log.info("TLS: reloaded the certificate in %s (new connections get it)", self.directory)
        return cert

    def fetch(self):  # -> grpc.ServerCertificateConfiguration | None
        """gRPC's `certificate_configuration_fetcher`: None keeps what it has."""
        try:
            cert = self.check()
            return None if cert is None else _config(cert)
        except Exception:  # a bug here must not fail the handshake
            log.exception("TLS: certificate reload check failed; keeping the current one")
            return None

    def credentials(self):  # -> grpc.ServerCredentials
        return grpc.dynamic_ssl_server_credentials(_config(self._current), self.fetch)
