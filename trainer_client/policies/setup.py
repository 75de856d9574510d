"""What a training run with a ``policies`` section needs before the trainer is built: the
model with the roles' adapters, one optimiser parameter group per adapter (its learning rate),
the endpoint player, and the trainer's keywords. Kept out of ``training.train`` so that the
run's set-up reads as one call."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from env_server.protocol.markers import Role
from trainer_client.policies.adapters import attach_adapters, optimizer_groups
from trainer_client.policies.endpoint import EndpointPlayer
from trainer_client.policies.phases import PhaseCallback

__all__ = ["PolicySetup", "setup_policies"]


@dataclass
class PolicySetup:
    """The run's policies, ready for ``DebateGRPOTrainer``.

    Attributes:
        model: the policy (a PEFT model when any role has an adapter, else the model as loaded).
        trainer_kwargs: ``policies``, ``endpoint`` and ``optimizers`` for the trainer (empty
            without a ``policies`` section: the trainer is exactly as before).
        endpoint: the endpoint player, if a role has an endpoint.
        callbacks: trainer callbacks the policies need (:class:`~trainer_client.policies.phases.
            PhaseCallback` under ``policies.phases``), to go before the metrics file's callback.
    """

    model: Any
    trainer_kwargs: dict[str, Any] = field(default_factory=dict)
    endpoint: EndpointPlayer | None = None
    callbacks: list[Any] = field(default_factory=list)

    def close(self) -> None:
        """Close the endpoint clients."""
        if self.endpoint is not None:
            self.endpoint.close()


def setup_policies(config: Any, model: Any, args: Any) -> PolicySetup:
    """The policies of ``config.policies`` around the loaded ``model``.

    With adapters: PEFT wraps the model (base frozen), each adapter's ``base_model_name_or_path``
    is made absolute where the base is a local folder (so ``final/<adapter>`` loads from
    anywhere), the optimiser is AdamW with one group per adapter (TRL's ``adam_*`` and
    ``weight_decay`` settings, the adapter's learning rate; the scheduler scales every group
    alike), and DDP is told every trained parameter gets a gradient at each step
    (``ddp_find_unused_parameters=False``: the router runs every adapter's pass).

    Args:
        config: the run's :class:`~trainer_client.config.TrainConfig`.
        model: the loaded causal LM.
        args: the run's ``GRPOConfig`` (its DDP setting is written here).
    """
    import torch

    policies = config.policies
    if not policies.active:
        return PolicySetup(model)
    kwargs: dict[str, Any] = {"policies": policies}
    callbacks: list[Any] = []
    if policies.adapters:
        local = Path(str(getattr(model, "name_or_path", "") or ""))
        model = attach_adapters(model, policies)
        if local.is_dir():
            for peft_config in model.peft_config.values():
                peft_config.base_model_name_or_path = str(local.resolve())
        groups = optimizer_groups(model, policies, config.learning_rate, args.weight_decay)
        optimizer = torch.optim.AdamW(groups, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon)
        kwargs["optimizers"] = (optimizer, None)
        args.ddp_find_unused_parameters = False
        if policies.phases is not None:
            callbacks.append(PhaseCallback(policies, optimizer))
    specs = {role: entry.endpoint for role in Role if (entry := policies.entry(role)) is not None and entry.endpoint}
    endpoint = None
    if specs:
        endpoint = EndpointPlayer(specs, temperature=config.temperature, max_tokens=config.max_completion_length)
        kwargs["endpoint"] = endpoint
    return PolicySetup(model, kwargs, endpoint, callbacks)
