"""The documented import path of reward shaping (README: ``from trainer_client.shaping import
RewardShapingStrategy, ShapingBatch, register_strategy``); it lives in
:mod:`trainer_client.credit.shaping`."""

from trainer_client.credit.shaping import (
    NO_STRATEGY_MESSAGE,
    ComaAdvantageStrategy,
    DifferenceRewardsStrategy,
    IdentityStrategy,
    MixingParams,
    PotentialBasedStrategy,
    PotentialParams,
    RewardMixingStrategy,
    RewardShapingConfig,
    RewardShapingStrategy,
    ShapedRewards,
    ShapingBatch,
    StrategyParams,
    available_strategies,
    create_strategy_from_config,
    get_strategy,
    register_strategy,
    shaping_metrics,
    strategy_class,
)

__all__ = [
    "NO_STRATEGY_MESSAGE", "ComaAdvantageStrategy", "DifferenceRewardsStrategy", "IdentityStrategy",
    "MixingParams", "PotentialBasedStrategy", "PotentialParams", "RewardMixingStrategy",
    "RewardShapingConfig", "RewardShapingStrategy", "ShapedRewards", "ShapingBatch", "StrategyParams",
    "available_strategies", "create_strategy_from_config", "get_strategy", "register_strategy",
    "shaping_metrics", "strategy_class",
]
