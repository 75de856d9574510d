"""A request that failed is not an answer, in training (issue 45): ``mathdebate train`` against
a live env server with the judge played by a real local endpoint that answers every other
request with a 400 and the server's message (``tests/helpers/failing_endpoint.py``), and a
trace-replay teacher on that endpoint that always gets the 400, beside two oracles. Every
rollout whose judge request failed is dropped from its group and counted (``rollouts/failed``
in ``metrics.jsonl``), no replay with a failed teacher call gives a pair (the oracles agree and
the student errs: each would), and the run writes its outputs, then exits 3 with the first
server message."""

from __future__ import annotations

import json

import pytest
from failing_endpoint import CONTEXT_MESSAGE, serve_failing_endpoint

from trainer_client.cli import main
from trainer_client.training.reporting import read_metrics


def test_failed_endpoint_requests_drop_rollouts_give_no_pairs_and_exit_3(server_url, tiny_model_dir, tmp_path,
                                                                         capsys) -> None:
    out = tmp_path / "run"
    with serve_failing_endpoint() as (url, state):
        teachers = [{"name": "oracle-a", "kind": "oracle"}, {"name": "oracle-b", "kind": "oracle"},
                    {"name": "served", "kind": "openai", "base_url": url, "model": "context-400-teacher", "max_retries": 0}]
        capsys.readouterr()
        code = main(["train", "--model", tiny_model_dir, "--env-url", server_url, "--max-steps", "2",
                     "--output-dir", str(out), "-o", "per_device_train_batch_size=4", "-o", "num_generations=4",
                     "-o", "max_completion_length=1024", "-o", "max_rounds=1", "-o", "learning_rate=1e-3",
                     "-o", "policies.solver.adapter=solver", "-o", "policies.verifier.adapter=verifier",
                     "-o", f"policies.judge.endpoint=openai:{url}#every-other",
                     "-o", "replay.beta=0.05", "-o", f"replay.teachers={json.dumps(teachers)}",
                     "-o", "replay.budget_per_step=6", "-o", "replay.roles=[solver]"])
        judge_requests, teacher_requests = state.requests["every-other"], state.requests["context-400-teacher"]
    captured = capsys.readouterr()
    assert code == 3, captured.err[-3000:]
    lines = read_metrics(out / "metrics.jsonl")
    assert [line["step"] for line in lines] == [1, 2]  # the run went to its end and wrote its outputs
    assert (out / "final" / "solver" / "adapter_config.json").exists() and f"model: {out / 'final'}" in captured.out
    # every other judge request failed (a 400 is not retried) and failed its rollout (one judge
    # turn each), which was dropped from its group and counted; the others were scored
    assert judge_requests >= 2
    assert sum(line["rollouts/failed"] for line in lines) == (judge_requests + 1) // 2
    assert all(line["rollouts/dropped"] >= line["rollouts/failed"] for line in lines)
    assert any(line["rollouts/dropped"] < 4 for line in lines) and "debate/reward/solver" in lines[-1]
    # the served teacher failed every replay it was asked: no pair, although the oracles agree
    assert teacher_requests >= 1 and 1 <= lines[-1]["teachers/failed_replays"] <= teacher_requests
    assert all(line.get("pairs/emitted", 0) == 0 for line in lines)
    message = captured.err.strip().splitlines()[-1]
    assert message.startswith("mathdebate train: ") and "model requests (endpoint roles and teachers) failed" in message
    failed_requests = (judge_requests + 1) // 2 + teacher_requests
    assert f"{failed_requests} of {judge_requests + teacher_requests} model requests" in message
    assert "more than --max-failed-share 5%" in message and CONTEXT_MESSAGE in message


def test_training_stops_after_the_step_where_the_share_is_passed(tmp_path) -> None:
    """The stop rule on real tallies and transformers' own callback objects: below
    ``MIN_REQUESTS_BEFORE_STOP`` requests nothing stops; past it, more than the share failed
    stops training after the step, and the end-of-run check raises with the counts, the step
    and the first server message; within the share it does neither."""
    from transformers import TrainerControl, TrainerState

    from env_server.client.failures import FailureTally, RequestFailure, TooManyFailuresError
    from trainer_client.training.train import MIN_REQUESTS_BEFORE_STOP, _FailedRequests

    endpoint, teachers = FailureTally(), FailureTally()
    check = _FailedRequests([endpoint, teachers], max_share=0.05)
    callback, state, control = check.callback(), TrainerState(global_step=1), TrainerControl()
    endpoint.request(MIN_REQUESTS_BEFORE_STOP - 3)
    teachers.request(2)
    for _ in range(2):
        teachers.fail(RequestFailure("http_400", CONTEXT_MESSAGE, 400))
    callback.on_step_end(None, state, control)
    assert not control.should_training_stop  # 2 of 19: too few requests to stop on
    endpoint.request()
    callback.on_step_end(None, state, control)
    assert control.should_training_stop and check.stopped_at == 1  # 2 of 20: 10%
    with pytest.raises(TooManyFailuresError) as raised:
        check.raise_if_exceeded(tmp_path, 1, 10)
    message = str(raised.value)
    assert message.startswith("2 of 20 model requests (endpoint roles and teachers) failed (10.0%, more than "
                              "--max-failed-share 5%); training stopped at step 1 of 10; the first failure: http_400: ")
    assert CONTEXT_MESSAGE in message and raised.value.output_dir == str(tmp_path)
    within = _FailedRequests([endpoint], max_share=0.05)  # the endpoint's 18 requests, none failed
    control = TrainerControl()
    within.callback().on_step_end(None, state, control)
    assert not control.should_training_stop
    within.raise_if_exceeded(tmp_path, 1, 10)  # does not raise
