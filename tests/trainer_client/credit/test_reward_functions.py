"""User reward functions: pointwise and batch, run in a worker process with a timeout."""

from __future__ import annotations

import time

import pytest
import reward_fns

from trainer_client.credit.reward_functions import (
    EvaluateResult,
    RewardFunctionRunner,
    RolloutMessage,
    StepOutput,
    load_reward_function,
    reward_function,
)

ROLLOUTS = [
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "it is 4"},
     {"role": "tool", "content": "verifier, check"}, {"role": "assistant", "content": "VERDICT: CORRECT"}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "5", "tool_calls": [{"x": 1}]}],
]


@pytest.fixture(scope="module")
def runner_for():
    runners = []

    def make(spec):
        runner = RewardFunctionRunner(spec)
        runners.append(runner)
        return runner

    yield make
    for runner in runners:
        runner.close()


def test_pointwise_runs_in_a_worker_with_step_outputs_and_kwargs(runner_for) -> None:
    results = runner_for(reward_fns.assistant_turns).evaluate(ROLLOUTS, ["4", "4"], bonus=3)
    assert [r.score for r in results] == [1.0, 0.0]
    assert all(r.is_score_valid for r in results)
    assert [s.base_reward for s in results[0].step_outputs] == [1.0, 0.0]
    assert [s.step_index for s in results[0].step_outputs] == [0, 1]
    assert results[1].metrics == {"turns": 1.0, "bonus": 3.0}


def test_batch_mode_gets_all_rollouts_in_one_call(runner_for) -> None:
    results = runner_for(reward_fns.batch_lengths).evaluate(ROLLOUTS, [None, None])
    assert [r.score for r in results] == [4.0, 2.0]
    assert results[0].step_outputs is None  # results without step outputs stay valid


def test_signature_suggests_but_configuration_decides() -> None:
    assert reward_fns.rollouts_messages_named.__reward_function__.mode == "batch"
    assert reward_fns.assistant_turns.__reward_function__.mode == "pointwise"
    assert load_reward_function("reward_fns:rollouts_messages_named", mode="pointwise").mode == "pointwise"
    spec = load_reward_function("reward_fns:plain", timeout_s=3)
    assert (spec.mode, spec.timeout_s, spec.name) == ("pointwise", 3, "plain")


def test_an_undecorated_function_returning_a_dict_works(runner_for) -> None:
    [result] = runner_for(load_reward_function("reward_fns:plain")).evaluate(ROLLOUTS[:1], ["4"])
    assert result.score == 2.0 and result.step_outputs[0].step_index == "1"


def test_a_raising_function_gives_an_invalid_score_with_the_reason(runner_for) -> None:
    results = runner_for(reward_fns.raises).evaluate(ROLLOUTS, ["4", "4"])
    assert all(not r.is_score_valid and r.score == 0.0 for r in results)
    assert "RuntimeError: user bug" in results[0].reason


def test_a_function_past_its_timeout_is_killed_and_the_runner_keeps_working(runner_for) -> None:
    runner = runner_for(reward_fns.sleeps)
    start = time.monotonic()
    [result] = runner.evaluate(ROLLOUTS[:1], ["4"])
    assert time.monotonic() - start < 10
    assert not result.is_score_valid and "timeout" in result.reason
    runner.spec = load_reward_function("reward_fns:assistant_turns")  # same worker pool, next call
    assert runner.evaluate(ROLLOUTS[:1], ["4"])[0].score == 1.0


@pytest.mark.parametrize("name, fragment", [("wrong_type", "must return an EvaluateResult"),
                                            ("batch_short", "returned 1 results for 2 rollouts")])
def test_wrong_results_are_invalid_not_crashes(runner_for, name: str, fragment: str) -> None:
    results = runner_for(load_reward_function(f"reward_fns:{name}")).evaluate(ROLLOUTS, ["4", "4"])
    assert len(results) == 2 and all(not r.is_score_valid for r in results)
    assert fragment in results[0].reason


def test_lambdas_and_closures_are_refused() -> None:
    with pytest.raises(TypeError, match="module-level"):
        reward_function(lambda messages, ground_truth: EvaluateResult(score=1))

    def outer():
        @reward_function
        def inner(messages, ground_truth):
            return EvaluateResult(score=1)

    with pytest.raises(TypeError, match="module-level"):
        outer()


def test_models_round_trip_through_json() -> None:
    result = EvaluateResult(score=0.5, step_outputs=[StepOutput(step_index="2", base_reward=1.0, metrics={"a": 1.0})])
    assert EvaluateResult.model_validate_json(result.model_dump_json()) == result
    assert EvaluateResult.model_validate({"score": 1.0}).step_outputs is None
    message = RolloutMessage.model_validate({"role": "assistant", "content": None, "tool_calls": [{"function": {}}]})
    assert RolloutMessage.model_validate_json(message.model_dump_json()) == message
