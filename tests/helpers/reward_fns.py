"""Reward functions for tests/trainer_client/credit/test_reward_functions.py (module level: the runner's worker
process imports them by path)."""

from __future__ import annotations

import time

from trainer_client.credit.reward_functions import EvaluateResult, RolloutMessage, StepOutput, reward_function


@reward_function
def assistant_turns(messages: list[RolloutMessage], ground_truth, **kwargs) -> EvaluateResult:
    """1 per assistant message whose text contains the ground truth; a step output each."""
    steps = []
    for index, message in enumerate(m for m in messages if m.role == "assistant"):
        hit = ground_truth in (message.content or "")
        steps.append(StepOutput(step_index=index, base_reward=float(hit), reason="contains" if hit else None))
    return EvaluateResult(score=float(any(s.base_reward for s in steps)), step_outputs=steps,
                          metrics={"turns": float(len(steps)), "bonus": float(kwargs.get("bonus", 0))})


@reward_function(mode="batch")
def batch_lengths(rollouts_messages, ground_truths, **kwargs) -> list[EvaluateResult]:
    """The number of messages of each rollout (no step outputs)."""
    return [EvaluateResult(score=float(len(messages))) for messages in rollouts_messages]


@reward_function
def rollouts_messages_named(rollouts_messages, ground_truths):  # the name suggests batch
    return [EvaluateResult(score=1.0) for _ in rollouts_messages]


@reward_function
def raises(messages, ground_truth, **kwargs):
    raise RuntimeError("user bug")


@reward_function(timeout_s=1.0)
def sleeps(messages, ground_truth, **kwargs):
    time.sleep(30)
    return EvaluateResult(score=1.0)


@reward_function
def wrong_type(messages, ground_truth, **kwargs):
    return 0.5


@reward_function(mode="batch")
def batch_short(rollouts_messages, ground_truths, **kwargs):
    return [EvaluateResult(score=1.0)]


def plain(messages, ground_truth, **kwargs):
    """Not decorated: the config gives its mode."""
    return {"score": 2.0, "step_outputs": [{"step_index": "1", "base_reward": 0.5}]}


@reward_function
def boxed_steps(messages: list[RolloutMessage], ground_truth, **kwargs) -> EvaluateResult:
    """Step reward 1 for each assistant turn that boxes an answer (in text or tool arguments),
    score = whether any boxed answer equals the ground truth as a string."""
    steps, hit = [], False
    for index, message in enumerate(m for m in messages if m.role == "assistant"):
        text = (message.content or "") + " ".join(str(call) for call in message.tool_calls or [])
        steps.append(StepOutput(step_index=index, base_reward=float("boxed" in text)))
        hit = hit or (ground_truth is not None and f"{{{ground_truth}}}" in text)
    return EvaluateResult(score=float(hit), step_outputs=steps)


@reward_function
def first_answer_is_gold(messages: list[RolloutMessage], ground_truth, **kwargs) -> EvaluateResult:
    """1 when the first assistant message boxes ``ground_truth`` exactly (``mathdebate eval
    --select reward:...`` tests)."""
    from env_server.debate.answers import final_answer

    first = next((m.content or "" for m in messages if m.role == "assistant"), "")
    return EvaluateResult(score=float(final_answer(first) == ground_truth))
