"""Adapters trained in turn (``policies.phases``, :class:`~trainer_client.policies.settings.PhaseSchedule`).

Every step still plays each role with its own adapter and computes the whole loss; before the
optimizer steps, :class:`PhaseCallback` drops the gradients of every adapter the step's phase
does not train (``param.grad = None``). ``torch.optim.AdamW`` skips a parameter without a
gradient entirely, so a paused adapter's weights, its Adam moments and its weight decay all stay
as they were. The gradient has already been clipped by then (transformers clips, then calls
``on_pre_optimizer_step``), so the clipping norm includes the paused adapter's gradient:
``max_grad_norm`` scales the trained adapter's step down by the same factor a joint step would.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import TrainerCallback

from trainer_client.policies.settings import PoliciesConfig

__all__ = ["PHASE_METRIC", "PhaseCallback"]

#: The metric each logged step carries: the index in ``phases.order`` of the step's phase.
PHASE_METRIC = "policies/phase"


class PhaseCallback(TrainerCallback):
    """Pauses the adapters outside the current phase at each optimizer step (transformers >= 4.45
    ``on_pre_optimizer_step``, read in transformers 5.24's ``Trainer._inner_training_loop``: after
    gradient clipping, before ``optimizer.step()``).

    Args:
        policies: the run's policies; ``policies.phases`` must be set.
        optimizer: the run's optimizer, one parameter group per adapter with an ``"adapter"`` key
            (:func:`~trainer_client.policies.adapters.optimizer_groups`).

    Raises:
        ValueError: no ``phases``, or an optimizer group without its adapter's name.
    """

    def __init__(self, policies: PoliciesConfig, optimizer: torch.optim.Optimizer) -> None:
        if policies.phases is None:
            raise ValueError("PhaseCallback needs policies.phases")
        if any("adapter" not in group for group in optimizer.param_groups):
            raise ValueError("every optimizer group must name its adapter (trainer_client.policies.adapters."
                             "optimizer_groups)")
        self.policies = policies
        self.phases = policies.phases
        self.optimizer = optimizer

    def pause(self, step: int) -> str:
        """Drop the gradients of every adapter that optimizer step ``step`` does not train;
        returns the adapter it trains."""
        trained = self.policies.phase_adapter(step)
        assert trained is not None  # phases is set (checked at construction)
        for group in self.optimizer.param_groups:
            if group["adapter"] != trained:
                for param in group["params"]:
                    param.grad = None
        return trained

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.pause(state.global_step)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if logs is not None and state.global_step > 0 and "loss" in logs:  # a training step's line
            step = state.global_step - 1
            logs[PHASE_METRIC] = float((step // self.phases.steps) % len(self.phases.order))
