"""The settings of the two built-in loss channels (``sdpo`` and ``replay`` in the config), in a
module of their own so that reading a config never imports torch."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from env_server.protocol.markers import Role
from trainer_client.losses.teachers import TeacherConfig

__all__ = ["ReplayConfig", "SDPOConfig"]


class SDPOConfig(BaseModel):
    """Hint distillation at error sites (generalized JSD to a hint-conditioned self).

    Attributes:
        alpha: weight of the channel in the total loss (0 disables it).
        jsd_beta: mixture coefficient of the generalized JSD (0.5: symmetric).
        temperature: softmax temperature of both distributions.
        token_clip: cap on each token's divergence, nats (``None``: no cap).
        max_sites_per_batch: most error sites distilled per micro-batch (the rest are skipped).
        roles: roles whose erring turns are distilled.
        backend: ``"gkd"`` (TRL's GKD ``generalized_jsd_loss`` on full logits; supports
            ``token_clip``) or ``"liger"`` (liger-kernel's ``LigerFusedLinearJSDLoss`` on
            hidden states, never materialising ``(N, V)`` logits; ``pip install
            'mathdebate[liger]'``; no ``token_clip``).
    """

    model_config = ConfigDict(extra="forbid")

    alpha: float = Field(default=0.0, ge=0)
    jsd_beta: float = Field(default=0.5, gt=0, lt=1)
    temperature: float = Field(default=1.0, gt=0)
    token_clip: float | None = Field(default=None, gt=0)
    max_sites_per_batch: int = Field(default=16, ge=1)
    roles: list[Role] = Field(default_factory=lambda: [Role.SOLVER, Role.VERIFIER])
    backend: Literal["gkd", "liger"] = "gkd"

    @model_validator(mode="after")
    def _check(self) -> SDPOConfig:
        if self.backend == "liger" and self.token_clip is not None:
            raise ValueError("sdpo.token_clip needs backend 'gkd' (liger's fused JSD has no per-token clip)")
        return self


class ReplayConfig(BaseModel):
    """N-teacher trace-replay DPO.

    Attributes:
        beta: weight of the channel in the total loss (0 disables it).
        dpo_beta: DPO's temperature.
        teachers: the teacher pool (at least 2 when ``beta > 0``: a pair needs 2 agreeing).
        budget_per_step: most teacher calls started per training step.
        pairs_per_step: pairs in the DPO term of one optimiser step, drawn once per step and
            dealt over its gradient-accumulation micro-batches (the same DPO batch whatever the
            accumulation); per process, like TRL's ``per_device_train_batch_size``, so a step of
            N processes averages N × ``pairs_per_step`` pairs. Each pair costs about one context
            plus two turns of forward and backward: about 0.17 of a plain GRPO step over 8
            rollouts of 512 tokens (README, "Performance").
        roles: roles whose turns are replayed to teachers.
        max_workers: threads running teacher calls.
        pairs_path: JSONL of pairs (default: ``<output_dir>/replay_pairs.jsonl``).
    """

    model_config = ConfigDict(extra="forbid")

    beta: float = Field(default=0.0, ge=0)
    dpo_beta: float = Field(default=0.1, gt=0)
    teachers: list[TeacherConfig] = Field(default_factory=list)
    budget_per_step: int = Field(default=16, ge=0)
    pairs_per_step: int = Field(default=4, ge=1)
    roles: list[Role] = Field(default_factory=lambda: [Role.SOLVER])
    max_workers: int = Field(default=4, ge=1)
    pairs_path: str | None = None
