"""Provenance records against the real checkout, packages, machine and a real server."""

from __future__ import annotations

import json

from provenance_checks import check_provenance

from env_server.debate.problems import load_problem_source
from env_server.provenance import config_hash, provenance, server_info, write_provenance


def test_provenance_names_code_versions_config_server_and_machine(server_url, tmp_path):
    config = {"model": "tiny", "seed": 3, "path": tmp_path}  # a value JSON cannot hold is kept as text
    record = provenance(config, [server_url])
    check_provenance(record, [load_problem_source(None).fingerprint()])
    assert record["env_servers"][0]["url"] == server_url
    assert record["config"] == {"model": "tiny", "seed": 3, "path": str(tmp_path)}
    assert record["config_sha256"] == config_hash({"seed": 3, "path": str(tmp_path), "model": "tiny"})
    assert "vllm" not in record["packages"] and "vllm" in provenance(vllm=True)["packages"]
    written = write_provenance(tmp_path, record)
    assert json.loads(written.read_text()) == record


def test_a_server_that_cannot_be_read_is_named_with_the_error():
    entry = server_info("http://127.0.0.1:9", timeout_s=2)
    assert entry["url"] == "http://127.0.0.1:9" and "error" in entry
