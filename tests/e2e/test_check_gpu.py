"""scripts/check_gpu.sh where there is no CUDA (here, CI): one `unavailable: <why>` line per
check and exit 0. On a machine with CUDA it runs the checks (minutes); this test then skips."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def test_check_gpu_prints_one_unavailable_line_per_check_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: run scripts/check_gpu.sh itself")
    done = subprocess.run(["bash", "scripts/check_gpu.sh"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert [line.split(":", 1)[0] for line in lines] == ["bf16-train", "liger-jsd", "liger-train", "hf-eval",
                                                                 "vllm-colocate", "scale"]
    assert all(": unavailable: no CUDA device" in line for line in lines)
