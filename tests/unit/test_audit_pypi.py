"""scripts/audit_pypi.py against a registry on loopback: real HTTP, the records are ours
(PyPI itself is not reachable from a test; its record shapes are copied from pypi.org's
JSON API: `info.version`, `releases`, `vulnerabilities[].id/fixed_in/withdrawn`)."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "audit_pypi.py"
spec = importlib.util.spec_from_file_location("audit_pypi", SCRIPT)
audit_pypi = importlib.util.module_from_spec(spec)
sys.modules["audit_pypi"] = audit_pypi  # dataclasses look their module up there
spec.loader.exec_module(audit_pypi)

ADVISORY = {"id": "PYSEC-2099-1", "fixed_in": ["2.0"], "withdrawn": None}
RECORDS: dict[str, object] = {
    # a release record reachable: exact, whatever the newest release is
    "/pypi/exact/1.0/json": {"info": {"version": "1.0"}, "vulnerabilities": [ADVISORY]},
    # only the project record: newest release installed -> its list applies
    "/pypi/newest/json": {"info": {"version": "3.1"}, "vulnerabilities": []},
    "/pypi/newbad/json": {"info": {"version": "5.0"}, "vulnerabilities": [ADVISORY]},
    # an older release installed, its own record unreachable -> unaudited
    "/pypi/older/json": {"info": {"version": "9.0"}, "vulnerabilities": []},
    # a withdrawn advisory does not count
    "/pypi/withdrawn/json": {
        "info": {"version": "1.0"},
        "vulnerabilities": [{**ADVISORY, "withdrawn": "2099-01-01T00:00:00"}],
    },
}


class _Registry(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/pypi/broken/"):
            self.send_error(500)
            return
        record = RECORDS.get(self.path)
        if record is None:
            self.send_error(404)
            return
        body = json.dumps(record).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def index() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _verdicts(index: str, dists: list[tuple[str, str]]) -> dict[str, object]:
    found = audit_pypi.audit(dists, audit_pypi.http_fetch(5.0), index)
    return {v.name: v for v in found}


def test_each_record_decides_as_documented(index: str) -> None:
    v = _verdicts(
        index,
        [
            ("exact", "1.0"),
            ("newest", "3.1"),
            ("newbad", "5.0"),
            ("older", "8.2"),
            ("withdrawn", "1.0"),
            ("missing", "0.1"),
            ("broken", "1.0"),
        ],
    )
    assert v["exact"].state == "vulnerable" and v["exact"].source == "release record"
    assert v["exact"].advisories == ("PYSEC-2099-1 (fixed in 2.0)",)
    assert v["newest"].state == "clean" and v["newest"].source == "project record (newest)"
    assert v["newbad"].state == "vulnerable"
    assert v["older"].state == "unaudited" and "not the newest release (9.0)" in v["older"].reason
    assert v["withdrawn"].state == "clean"
    assert v["missing"].state == "unaudited" and v["missing"].reason == "not on the index"
    assert v["broken"].state == "unaudited" and "HTTPError" in v["broken"].reason


def _run(monkeypatch: pytest.MonkeyPatch, index: str, dists, *flags: str) -> int:
    monkeypatch.setattr(audit_pypi, "installed", lambda skip: dists)
    return audit_pypi.main(["--index-url", index, *flags])


def test_exit_codes(index: str, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    assert _run(monkeypatch, index, [("newest", "3.1")], "--strict") == 0
    assert _run(monkeypatch, index, [("newest", "3.1"), ("older", "1")]) == 0
    assert _run(monkeypatch, index, [("newest", "3.1"), ("older", "1")], "--strict") == 2
    assert _run(monkeypatch, index, [("exact", "1.0"), ("older", "1")], "--strict") == 1
    out = capsys.readouterr().out
    assert "VULNERABLE exact 1.0: PYSEC-2099-1 (fixed in 2.0)" in out
    assert "2 distributions: 0 clean, 1 vulnerable, 1 unaudited" in out


def test_installed_skips_the_editable_project_and_named_ones() -> None:
    names = {n.lower() for n, _ in audit_pypi.installed(["PyYAML"])}
    assert "epp" not in names  # installed with `pip install -e`
    assert "pyyaml" not in names
    assert "grpcio" in names
