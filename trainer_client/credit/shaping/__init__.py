"""Role-mapped reward shaping (numpy only; no torch).

A strategy maps a typed batch (:class:`ShapingBatch`) of ``N`` (rollout, role) samples' raw rewards
to shaped rewards, as one ``(N,)`` array or one ``(N,)`` array per role; the contract is in
:mod:`trainer_client.credit.shaping.base`. Built-in strategies: ``identity``, ``potential_based``,
``difference_rewards``, ``coma_advantage``, ``reward_mixing``, ``own_outcome``. The mapping of shaped values
onto turns and tokens is :mod:`trainer_client.credit.role_samples`.
"""

from trainer_client.credit.shaping.base import (
    RewardShapingStrategy,
    ShapedRewards,
    ShapingBatch,
    StrategyParams,
)
from trainer_client.credit.shaping.coma import ComaAdvantageStrategy
from trainer_client.credit.shaping.config import (
    NO_STRATEGY_MESSAGE,
    RewardShapingConfig,
    create_strategy_from_config,
)
from trainer_client.credit.shaping.difference import DifferenceRewardsStrategy
from trainer_client.credit.shaping.identity import IdentityStrategy
from trainer_client.credit.shaping.metrics import shaping_metrics
from trainer_client.credit.shaping.mixing import MixingParams, RewardMixingStrategy
from trainer_client.credit.shaping.own_outcome import OwnOutcomeStrategy
from trainer_client.credit.shaping.potential import PotentialBasedStrategy, PotentialParams
from trainer_client.credit.shaping.registry import (
    available_strategies,
    get_strategy,
    register_strategy,
    strategy_class,
)

__all__ = [
    "NO_STRATEGY_MESSAGE",
    "ComaAdvantageStrategy",
    "DifferenceRewardsStrategy",
    "IdentityStrategy",
    "MixingParams",
    "OwnOutcomeStrategy",
    "PotentialBasedStrategy",
    "PotentialParams",
    "RewardMixingStrategy",
    "RewardShapingConfig",
    "RewardShapingStrategy",
    "ShapedRewards",
    "ShapingBatch",
    "StrategyParams",
    "available_strategies",
    "create_strategy_from_config",
    "get_strategy",
    "register_strategy",
    "shaping_metrics",
    "strategy_class",
]
