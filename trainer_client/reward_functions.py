"""The documented import path of user reward functions (README: ``from
trainer_client.reward_functions import EvaluateResult, StepOutput, reward_function``); they live in
:mod:`trainer_client.credit.reward_functions`."""

from trainer_client.credit.reward_functions import (
    EvaluateResult,
    RewardFunctionRunner,
    RewardFunctionSpec,
    RolloutMessage,
    StepData,
    StepOutput,
    load_reward_function,
    reward_function,
    suggest_mode,
)

__all__ = [
    "EvaluateResult",
    "RewardFunctionRunner",
    "RewardFunctionSpec",
    "RolloutMessage",
    "StepData",
    "StepOutput",
    "load_reward_function",
    "reward_function",
    "suggest_mode",
]
