"""Checks of a provenance record (``env_server.provenance``) against the real state of this
checkout, this interpreter's packages, this machine and the servers a run used."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import env_server

REPO = Path(__file__).resolve().parents[2]


def check_provenance(record: Mapping[str, Any], fingerprints: Sequence[str] = (), vllm: bool = False) -> None:
    """Assert that ``record`` names the git commit of this checkout and whether its tracked
    files differ from it, the installed versions of torch, transformers, trl and math-verify
    (and vLLM when ``vllm``), a config with the SHA-256 of its canonical JSON, this machine's CPU
    and GPU counts, and the env servers the run used: this package's version and the problem
    sources' ``fingerprints``, in order."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
    assert record["git"]["commit"] == commit.stdout.strip()
    assert isinstance(record["git"]["dirty"], bool)
    for name in ("torch", "transformers", "trl", "math-verify"):
        assert record["packages"][name] == version(name), name
    assert ("vllm" in record["packages"]) == vllm
    config = record["config"]
    assert isinstance(config, dict) and config
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"))
    assert record["config_sha256"] == hashlib.sha256(canonical.encode()).hexdigest()
    machine = record["machine"]
    assert machine["cpu_count"] == os.cpu_count() and machine["cpu"]
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert machine["gpu_count"] == gpus == len(machine["gpus"])
    servers = record["env_servers"]
    assert [entry["problem_fingerprint"] for entry in servers] == list(fingerprints)
    for entry in servers:
        assert entry["version"] == env_server.__version__ and entry["name"] == "mathdebate"
        assert entry["problem_source"] and entry["url"].startswith("http://127.0.0.1:")
        assert entry["compiled"] is False  # the tests' servers run the checkout's pure Python
