"""The documented import path of the role mapping (README); it lives in
:mod:`trainer_client.credit.role_samples`."""

from trainer_client.credit.role_samples import (
    RoleSamples,
    announce_strategy,
    build_role_samples,
    group_normalize,
    resolve_sample_values,
    shape_samples,
    token_tensors,
    turn_values,
)

__all__ = [
    "RoleSamples", "announce_strategy", "build_role_samples", "group_normalize",
    "resolve_sample_values", "shape_samples", "token_tensors", "turn_values",
]
