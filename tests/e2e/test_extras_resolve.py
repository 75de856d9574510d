"""The extras the README, the Dockerfile and docker-compose.yml install resolve together, and to
versions the code runs on.

Each combination is resolved as a dry run for Linux x86_64, CPython 3.11, with torch held at the
installed build (the local CPU wheel here), so nothing is installed and no torch is downloaded.
The resolver is uv's (``uv pip compile``): it reads each wheel's metadata with HTTP range
requests. pip's dry-run (``pip install --dry-run --ignore-installed --report``) resolves the same
way but, on a registry that serves no separate metadata files (PEP 658; the one here serves
none), downloads every candidate wheel: measured for ``train,vllm`` here, 129 wheels, about
1.5 GB (vllm's 320 MB, triton's 286 MB, nvidia-* CUDA libraries), 45 to 70 s per combination.
uv resolves the four in about 10 s on first use (about 50 MB of metadata cached), then in a
second or two.

"Versions the code runs on": transformers within the range a test environment runs
(``TESTED_TRANSFORMERS``: the `train,test` environment gets the newest below the cap, the vLLM
CPU environment of scripts/check_vllm_cpu.sh the newest below vllm 0.31's cap), trl exactly
1.16.0, vllm within trl 1.16's supported range, peft the minor the role adapters were tested on.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]

# Every combination the README, Dockerfile (EXTRAS build-arg), docker-compose.yml and scripts/test.sh
# (train,test,docs) install.
COMBINATIONS = ["train", "train,vllm", "train,vllm,liger", "train,test", "train,test,docs", "train,harness", "train,verifiers"]
# What the code is exercised on: the floor is the vLLM CPU environment's transformers (5.17),
# the cap the one pyproject.toml names (5.40 drops `past_key_values`).
TESTED_TRANSFORMERS = SpecifierSet(">=5.17.0,<5.40")
TRL = SpecifierSet("==1.16.0")
VLLM = SpecifierSet(">=0.22.0,<=0.31.0")  # trl 1.16.0's own `vllm` extra
PEFT = SpecifierSet(">=0.21,<0.22")  # per-role adapters (trainer_client.policies), tested on 0.21.2


def _uv() -> str:
    found = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if not found:
        if os.environ.get("CI"):
            pytest.fail("uv is missing: it is in the `test` extra (scripts/setup_env.sh train,test installs it)")
        pytest.skip("uv is not installed (the `test` extra has it)")
    return found


def _resolve(extras: str, tmp_path: Path) -> dict[str, str]:
    import torch

    # the installed build: no other torch is considered (its local label, e.g. +cpu, only where the
    # wheel's folder is known: the registry has no such build)
    held = torch.__version__ if os.environ.get("PIP_FIND_LINKS") else Version(torch.__version__).public
    constraint = tmp_path / "torch.txt"
    constraint.write_text(f"torch=={held}\n")
    cmd = [_uv(), "pip", "compile", "--quiet", "--no-header", "--no-annotate", "--python-version", "3.11",
           "--python-platform", "x86_64-manylinux_2_28", "-c", str(constraint), str(REPO / "pyproject.toml")]
    for extra in extras.split(","):
        cmd += ["--extra", extra]
    if os.environ.get("PIP_FIND_LINKS"):  # where pip finds the local CPU torch wheel (uv reads no pip config)
        cmd += ["--find-links", os.environ["PIP_FIND_LINKS"]]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert out.returncode == 0, f"`{extras}` does not resolve:\n{out.stderr[-3000:]}"
    pins = {}
    for line in out.stdout.splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)", line.strip())
        if match:
            pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


@pytest.mark.slow
@pytest.mark.parametrize("extras", COMBINATIONS)
def test_extras_resolve_to_supported_versions(extras, tmp_path):
    import torch

    pins = _resolve(extras, tmp_path)
    assert Version(pins["torch"]).public == Version(torch.__version__).public  # the installed release
    assert Version(pins["transformers"]) in TESTED_TRANSFORMERS, pins["transformers"]
    assert Version(pins["trl"]) in TRL
    assert Version(pins["peft"]) in PEFT, pins["peft"]
    if "vllm" in extras.split(","):
        assert Version(pins["vllm"]) in VLLM
        # vllm 0.31 caps transformers below 5.18: the floor of TESTED_TRANSFORMERS is this case
        assert Version(pins["transformers"]) < Version("5.18")
    else:
        assert "vllm" not in pins
    if "liger" in extras.split(","):
        assert Version(pins["liger-kernel"]) in SpecifierSet(">=0.8.2,<0.9")
