"""A fingerprint of a model's weights, for pinning what a result depends on (checkpoints, resumed
runs, the committed tiny models, the ablations' reports)."""

from __future__ import annotations

from typing import Any

__all__ = ["weights_fingerprint"]


def weights_fingerprint(model: Any, sample: int = 4096) -> str:
    """A fingerprint of a model's weights: SHA-256 over every tensor's name, shape, dtype and
    up to ``sample`` evenly strided values (hashing every value of a 7B model would take
    seconds at each start; a strided sample of each tensor tells two checkpoints, two
    initialisations or two models apart)."""
    import hashlib

    import torch

    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            flat = tensor.detach().reshape(-1)
            step = max(1, flat.numel() // sample)
            values = flat[::step][:sample].to(device="cpu", dtype=torch.float64)
            digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
            digest.update(values.numpy().tobytes())
    return digest.hexdigest()
