"""Static endpoints: YAML file, CLI strings, strict validation, file watching."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from epp.datalayer.endpoints_file import (
    EndpointsError,
    load_endpoints_file,
    parse_endpoint_arg,
    parse_endpoint_args,
    parse_endpoints,
    watch_endpoints_file,
)
from epp.datastore import Datastore, Endpoint
from tests.eventually import eventually


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_list_form(tmp_path: Path) -> None:
    f = write(
        tmp_path / "eps.yaml",
        """
- name: sim-0
  address: 127.0.0.1
  port: 8000
  labels: {llm-d.ai/role: decode}
- {name: sim-1, address: "::1", port: 8001}
""",
    )
    assert load_endpoints_file(f) == [
        Endpoint("sim-0", "127.0.0.1", 8000, {"llm-d.ai/role": "decode"}),
        Endpoint("sim-1", "::1", 8001, {}),
    ]


def test_mapping_form_and_empty(tmp_path: Path) -> None:
    f = write(tmp_path / "eps.yaml", "endpoints:\n- {name: a, address: '[::1]', port: 1}\n")
    assert load_endpoints_file(f) == [Endpoint("a", "::1", 1, {})]
    assert load_endpoints_file(write(tmp_path / "e.yaml", "")) == []
    assert load_endpoints_file(write(tmp_path / "e2.yaml", "endpoints:\n")) == []


def err(data: object) -> str:
    with pytest.raises(EndpointsError) as info:
        parse_endpoints(data, "eps.yaml")
    assert isinstance(info.value, ValueError)
    return str(info.value)


def test_errors_name_file_entry_field_and_fix() -> None:
    ok = {"name": "a", "address": "10.0.0.1", "port": 8000}
    assert err([ok, {**ok, "name": "b", "port": "8000"}]) == (
        "eps.yaml: endpoints[1].port: must be an integer in 1..65535, got '8000' (str);"
        " write it unquoted, e.g. port: 8000"
    )
    assert err([{**ok, "port": 0}]).startswith("eps.yaml: endpoints[0].port: must be in 1..65535")
    assert "endpoints[0].port" in err([{**ok, "port": 70000}])
    assert "endpoints[0].port" in err([{**ok, "port": True}])
    assert "endpoints[0].address: must be a non-empty" in err([{**ok, "address": " "}])
    assert "endpoints[0].address" in err([{**ok, "address": 10}])
    assert "is a URL" in err([{**ok, "address": "http://h"}])
    assert "put the port in the 'port' field" in err([{**ok, "address": "h:80"}])
    assert "endpoints[0].port: is required" in err([{"name": "a", "address": "h"}])
    assert "endpoints[1].name: duplicate name 'a' (first used at entry 0)" in err([ok, ok])
    dup = err([ok, {**ok, "name": "b"}])
    assert "endpoints[1].port: 10.0.0.1:8000 is already endpoint entry 0" in dup
    assert "did you mean 'address'?" in err([{**ok, "adress": "x"}])
    assert "endpoints[0].prot: unknown key; did you mean 'port'?" in err([{**ok, "prot": 1}])
    assert "did you mean 'endpoints'?" in err({"endpoint": []})
    assert 'quote it, e.g. rank: "0"' in err([{**ok, "labels": {"rank": 0}}])
    assert "endpoints[0].labels: must be a mapping" in err([{**ok, "labels": ["x"]}])
    assert "expected a list of endpoints" in err("just a string")
    assert "endpoints[0]: each endpoint must be a mapping" in err(["a=1.2.3.4:5"])
    assert "contains whitespace" in err([{**ok, "name": "a b"}])


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(EndpointsError, match="cannot read the file"):
        load_endpoints_file(tmp_path / "missing.yaml")
    bad = write(tmp_path / "bad.yaml", "- {name: a, address: [\n")
    with pytest.raises(EndpointsError, match=r"bad\.yaml: not valid YAML"):
        load_endpoints_file(bad)


def test_cli_strings() -> None:
    assert parse_endpoint_arg("sim-0=127.0.0.1:8000;llm-d.ai/role=decode") == Endpoint(
        "sim-0", "127.0.0.1", 8000, {"llm-d.ai/role": "decode"}
    )
    assert parse_endpoint_arg("v6=[::1]:9000") == Endpoint("v6", "::1", 9000, {})
    assert parse_endpoint_arg("h=host.local:1;a=;b=x=y;") == Endpoint(
        "h", "host.local", 1, {"a": "", "b": "x=y"}
    )
    assert parse_endpoint_args(["a=h:1", "b=h:2"]) == [
        Endpoint("a", "h", 1, {}),
        Endpoint("b", "h", 2, {}),
    ]


@pytest.mark.parametrize(
    ("arg", "fragment"),
    [
        ("127.0.0.1:8000", "missing '='"),
        ("a=127.0.0.1", "has no ':port'"),
        ("a=:80", "has no ':port'"),
        ("a=h:port", "must be an integer"),
        ("a=h:0", "must be in 1..65535"),
        ("a=::1:80", "IPv6 address in brackets"),
        ("=h:80", "name: must be a non-empty string"),
        ("a=h:80;role", "must look like label=value"),
    ],
)
def test_cli_errors(arg: str, fragment: str) -> None:
    with pytest.raises(EndpointsError) as info:
        parse_endpoint_arg(arg)
    text = str(info.value)
    assert fragment in text
    assert text.startswith(f"--endpoint: {arg!r}: ")
    assert "expected name=host:port[;label=value...]" in text


def test_cli_duplicates() -> None:
    with pytest.raises(EndpointsError, match="duplicate name 'a'"):
        parse_endpoint_args(["a=h:1", "a=h:2"])
    with pytest.raises(EndpointsError, match="h:1 is already used by 'a=h:1'"):
        parse_endpoint_args(["a=h:1", "b=h:1"])


def bump_mtime(path: Path, step: int) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + step * 1_000_000_000))


async def test_watch_reloads_and_keeps_old_set_on_bad_file(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.ERROR, logger="epp.datalayer.endpoints_file")
    f = write(tmp_path / "eps.yaml", "- {name: a, address: h, port: 1}\n")
    ds = Datastore()
    task = asyncio.create_task(watch_endpoints_file(f, ds, interval=0.01))
    try:
        await eventually(lambda: [e.name for e in ds.endpoints()] == ["a"], "first load")
        write(f, "- {name: a, address: h, port: 1}\n- {name: b, address: h, port: 2}\n")
        bump_mtime(f, 1)
        await eventually(lambda: len(ds) == 2, "reload")
        write(f, "- {name: a, address: h, port: nope}\n")
        bump_mtime(f, 2)
        await eventually(lambda: "not reloaded" in caplog.text, "error logged")
        assert [e.name for e in ds.endpoints()] == ["a", "b"]  # old set kept
        assert "endpoints[0].port" in caplog.text
        write(f, "- {name: c, address: h, port: 3}\n")
        bump_mtime(f, 3)
        await eventually(lambda: [e.name for e in ds.endpoints()] == ["c"], "fixed file")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
