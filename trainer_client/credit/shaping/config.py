"""Reward-shaping configuration: validated at load time, turned into a strategy at start-up."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trainer_client.credit.shaping.base import RewardShapingStrategy
from trainer_client.credit.shaping.registry import get_strategy, strategy_class

__all__ = ["NO_STRATEGY_MESSAGE", "RewardShapingConfig", "create_strategy_from_config"]

logger = logging.getLogger("trainer_client.credit.shaping")

#: The INFO line logged when no strategy is configured.
NO_STRATEGY_MESSAGE = "No reward shaping strategy configured, using identity"


class RewardShapingConfig(BaseModel):
    """The ``reward_shaping`` section of a trainer config.

    Attributes:
        strategy: a registered strategy name (see
            :func:`~trainer_client.credit.shaping.registry.available_strategies`), or ``None`` for
            no shaping (identity).
        params: the strategy's parameters; replaced by the validated values, defaults filled.

    Raises:
        pydantic.ValidationError: unknown strategy (the message lists the available names),
            invalid params, or params without a strategy. Raised when the config is loaded,
            before any training starts.
    """

    model_config = ConfigDict(extra="forbid")
    strategy: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_strategy(self) -> RewardShapingConfig:
        if self.strategy is None:
            if self.params:
                raise ValueError(f"reward shaping params {sorted(self.params)} given without a strategy")
            return self
        try:
            cls = strategy_class(self.strategy)
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
        try:
            self.params = cls.Params.model_validate(self.params).model_dump()
        except ValidationError as exc:
            raise ValueError(f"invalid params for reward shaping strategy {self.strategy!r}: {exc}") from None
        return self


def create_strategy_from_config(
    cfg: RewardShapingConfig | Mapping[str, Any] | None,
) -> RewardShapingStrategy:
    """Build the configured strategy.

    Args:
        cfg: ``None``, an empty mapping, a mapping with the fields of
            :class:`RewardShapingConfig`, or the model itself. Missing or empty config (or
            ``strategy: None``) gives ``identity`` and logs :data:`NO_STRATEGY_MESSAGE` once at
            INFO on the ``trainer_client.credit.shaping`` logger.

    Raises:
        pydantic.ValidationError: the mapping is not a valid :class:`RewardShapingConfig`.
    """
    if cfg is None:
        cfg = RewardShapingConfig()
    elif not isinstance(cfg, RewardShapingConfig):
        cfg = RewardShapingConfig.model_validate(dict(cfg))
    if cfg.strategy is None:
        logger.info(NO_STRATEGY_MESSAGE)
        return get_strategy("identity")
    return get_strategy(cfg.strategy, **cfg.params)
