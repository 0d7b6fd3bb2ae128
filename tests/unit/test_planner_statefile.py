"""The local connector's statefile round-trips and refuses damage with a clear line."""

import pytest

from epp.config.errors import ConfigError
from epp.planner.core.types import Role
from epp.planner.live.connectors.statefile import WorkerRecord, decode, encode


def test_round_trip():
    workers = [
        WorkerRecord("aggregated-0", Role.AGGREGATED, 8001, 4242, ("epp", "sim"), "/l/a0.log"),
        WorkerRecord("decode-3", Role.DECODE, 8004, 4343, ("vllm", "serve", "m")),
    ]
    assert decode(encode(workers)) == workers


def test_a_decode_replica_with_its_sidecar_round_trips():
    rec = WorkerRecord(
        "decode-1", Role.DECODE, 9001, 500, ("epp", "sim", "--port", "9002"), "/l/d1.log",
        server_port=9002, sidecar_pid=501, sidecar_argv=("epp", "sidecar", "--port", "9001"),
    )  # fmt: skip
    assert decode(encode([rec])) == [rec]


def test_a_file_written_before_sidecars_reads_as_replicas_without_one():
    text = '{"version": 1, "workers": [{"name": "decode-0", "role": "decode", "port": 7, '
    text += '"pid": 9, "argv": ["epp", "sim"]}]}'
    (rec,) = decode(text)
    assert (rec.server_port, rec.sidecar_pid, rec.sidecar_argv) == (0, 0, ())


def test_empty():
    assert decode(encode([])) == []


@pytest.mark.parametrize(
    "text",
    ["not json", '{"version": 2, "workers": []}', '{"version": 1, "workers": [{"name": "x"}]}',
     '{"version": 1, "workers": [{"name": "x", "role": "gpu", "port": 1, "pid": 1, "argv": []}]}',
     "[]"],
)  # fmt: skip
def test_damage_is_one_clear_error(text):
    with pytest.raises(ConfigError) as e:
        decode(text, "/s/pool.json")
    assert str(e.value).startswith("/s/pool.json: unreadable statefile")
    assert "delete it" in str(e.value)
