"""``docker compose up`` without Docker: the trainer service's exact command and config, run as a
local process against a real server, with only the overrides a CPU box needs; and the compose
file's promises (no keys by default, the teacher behind a profile, writable named volumes)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from trainer_client.config import load_config

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _default_substitution(arg: str) -> str:
    """Compose's ``${VAR:-default}`` with the variable unset."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", arg)


def test_trainer_service_command_runs_with_cpu_overrides(tmp_path, server_url, tiny_model_dir):
    trainer = COMPOSE["services"]["trainer"]
    command = [_default_substitution(arg) for arg in trainer["command"]]
    assert command[:2] == ["mathdebate", "train"]
    mounts = dict(volume.split(":")[1::-1] for volume in trainer["volumes"] if volume.startswith("./"))
    args = [arg.replace("/configs", str(ROOT / mounts["/configs"].lstrip("./"))) for arg in command[2:]]
    config_path = Path(args[args.index("--config") + 1])
    assert config_path.name == "gpu_qwen.yaml" and config_path.exists()
    config = load_config(config_path)
    assert config.replay.beta == 0 and not config.replay.teachers  # the default path needs no key
    overrides = {"model": tiny_model_dir, "use_vllm": "false", "max_steps": "1", "per_device_train_batch_size": "2",
                 "gradient_accumulation_steps": "1", "num_generations": "2", "max_completion_length": "64",
                 "output_dir": str(tmp_path / "out")}
    if importlib.util.find_spec("liger_kernel") is None:
        overrides["sdpo.backend"] = "gkd"
    env_url = args.index("--env-url") + 1
    args[env_url] = server_url
    cli = [sys.executable, "-m", "trainer_client.cli", "train", *args]
    for key, value in overrides.items():
        cli += ["-o", f"{key}={value}"]
    run = subprocess.run(cli, capture_output=True, text=True, timeout=280,
                         env={k: v for k, v in os.environ.items() if k != "TEACHER_API_KEY"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "trace replay is off (replay.beta = 0)" in run.stderr
    metrics = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 1 and (tmp_path / "out" / "final").is_dir()


def test_teacher_profile_config_and_compose_layout():
    services = COMPOSE["services"]
    assert "profiles" not in services["env"] and "profiles" not in services["trainer"]
    assert services["teacher"]["profiles"] == ["teacher"]
    assert "TEACHER_API_KEY" not in str(services["trainer"].get("environment", {}))
    teacher_config = load_config(ROOT / "configs" / "gpu_qwen_teacher.yaml")
    assert teacher_config.replay.beta > 0 and len(teacher_config.replay.teachers) == 2
    assert {t.base_url for t in teacher_config.replay.teachers} == {"http://teacher:8001/v1"}
    assert all(t.api_key_env is None for t in teacher_config.replay.teachers)
    # outputs and the model cache are named volumes the image's user owns (Dockerfile chowns them)
    assert {"outputs", "model-cache"} <= set(COMPOSE["volumes"])
    assert "outputs:/outputs" in services["trainer"]["volumes"]
    assert "chown -R debate:debate /outputs /cache" in (ROOT / "Dockerfile").read_text()
    # trainer and teacher reserve different GPUs, as the file's header says
    gpu = [services[s]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for s in ("trainer", "teacher")]
    assert gpu == [["0"], ["1"]]
