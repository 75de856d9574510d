"""A request that failed is not an answer (issue 45): ``mathdebate eval`` against real local
endpoints that fail each way a served model fails (``tests/helpers/failing_endpoint.py``: a 400
with the server's message, a reply that never comes, a connection dropped mid-reply, a 200 that
is not JSON), on a real env server. Each failed episode is left out of every accuracy, counted
with its typed reason and the server's own message, said on the first line printed; more than
``--max-failed-share`` of the requests failing exits 3. A malformed tool call, the model's own
doing, stays scored. Retry budgets are small so that each case takes about a second."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from failing_endpoint import CONTEXT_MESSAGE, serve_failing_endpoint

from env_server.debate.problems import load_problem_source
from trainer_client.cli import main

LIMIT = 4


@pytest.fixture(scope="module")
def endpoint():
    source = load_problem_source(None)  # the built-in generator the session server serves
    gold = {p.problem: p.answer for p in (source.by_seed(i) for i in range(LIMIT))}
    with serve_failing_endpoint(hang_s=3.0, gold=gold) as served:
        yield served


def _eval(tmp_path: Path, server_url: str, capsys, policy: str, *args: str) -> tuple[int, dict, list[dict], str, str]:
    """Run ``mathdebate eval`` in single mode (one request per episode); return its exit code,
    ``results.json``, the trajectories, stdout and stderr."""
    out = tmp_path / "eval"
    capsys.readouterr()
    code = main(["eval", "--env-url", server_url, "--limit", str(LIMIT), "--mode", "single", "--policy", policy,
                 "--output-dir", str(out), "--no-progress", "--concurrency", str(LIMIT), *args])
    captured = capsys.readouterr()
    results = json.loads((out / "results.json").read_text())
    lines = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    return code, results, lines, captured.out, captured.err


def _all_failed(results: dict, lines: list[dict], kind: str) -> None:
    """Every episode failed with ``kind``: nothing was graded, nothing counts as wrong."""
    assert results["scored_problems"] == 0 and results["failed_problems"] == LIMIT
    assert results["accuracy"] is None and results["first_answer_accuracy"] is None
    assert results["episodes_failed"] == LIMIT and results["episodes_scored"] == 0
    assert results["error_kinds"] == {} and results["forfeits"] == {}  # never graded as a missing answer
    assert list(results["failures"]["reasons"]) == [kind]
    assert results["failures"]["requests"]["failed"] == results["requests_failed"] == LIMIT
    for line in lines:
        assert line["rewards"] is None and line["failure"]["kind"] == kind
        assert [turn["forfeit"] for turn in line["turns"]] == ["request_failed"]


def test_a_400_with_the_servers_message_fails_every_episode_and_exits_3(tmp_path, server_url, endpoint, capsys):
    url, state = endpoint
    before = state.requests["context-400"]
    code, results, lines, out, err = _eval(tmp_path, server_url, capsys, f"openai-tools:{url}#context-400",
                                           "--retries", "2")
    assert code == 3
    _all_failed(results, lines, "http_400")
    assert results["failures"]["reasons"]["http_400"] == {"count": LIMIT, "example": CONTEXT_MESSAGE}
    assert lines[0]["failure"]["status"] == 400
    assert state.requests["context-400"] - before == LIMIT  # a 400 is not retried: it would fail again
    # the first line printed says how many failed and why, in the server's own words
    first = out.splitlines()[0]
    assert first.startswith(f"FAILED: {LIMIT} of {LIMIT} episodes failed and are not scored")
    assert "http_400" in first and CONTEXT_MESSAGE in first
    assert f"{LIMIT} of {LIMIT} model requests failed (100.0%, more than --max-failed-share 5%)" in err
    assert CONTEXT_MESSAGE in err


def test_accuracy_is_over_the_scored_episodes_and_the_share_decides_the_exit(tmp_path, server_url, endpoint, capsys):
    """Every other request fails: half the problems are scored (all right), the other half are
    left out, not counted wrong; 50% of the requests failed, so exit 3 at the default 5% and 0
    with ``--max-failed-share 0.6``, the failures said first either way."""
    url, _ = endpoint
    for share, expected in (("0.05", 3), ("0.6", 0)):
        code, results, lines, out, _ = _eval(tmp_path, server_url, capsys, f"openai:{url}#every-other",
                                             "--max-failed-share", share)
        assert code == expected
        assert results["scored_problems"] == results["failed_problems"] == LIMIT // 2
        assert results["accuracy"] == 1.0  # over the scored problems only
        assert results["accuracy_ci95"][1] == pytest.approx(1.0) and results["accuracy_ci95"][0] > 0.3
        assert results["failures"]["requests"] == {
            "requests": LIMIT, "failed": LIMIT // 2, "share": 0.5,
            "reasons": {"http_400": {"count": LIMIT // 2, "example": CONTEXT_MESSAGE}}}
        assert sum(line["rewards"] is not None for line in lines) == LIMIT // 2
        assert out.splitlines()[0].startswith(f"FAILED: {LIMIT // 2} of {LIMIT} episodes failed")


def test_a_reply_that_never_comes_is_retried_then_fails_as_a_timeout(tmp_path, server_url, endpoint, capsys):
    url, state = endpoint
    before = state.requests["hang"]
    code, results, lines, out, err = _eval(tmp_path, server_url, capsys, f"openai:{url}#hang",
                                           "--timeout", "0.4", "--retries", "1")
    assert code == 3
    _all_failed(results, lines, "timeout")
    assert results["failures"]["reasons"]["timeout"]["example"] == "no reply within 0.4 s (after 1 retries)"
    assert state.requests["hang"] - before == 2 * LIMIT  # one try and one retry each
    assert out.splitlines()[0].startswith(f"FAILED: {LIMIT} of {LIMIT} episodes failed") and "timeout" in err


def test_a_connection_dropped_mid_reply_is_retried_then_fails(tmp_path, server_url, endpoint, capsys):
    url, state = endpoint
    before = state.requests["drop"]
    code, results, lines, out, err = _eval(tmp_path, server_url, capsys, f"openai:{url}#drop", "--retries", "1")
    assert code == 3
    _all_failed(results, lines, "connection")
    example = results["failures"]["reasons"]["connection"]["example"]
    assert "peer closed connection without sending complete message body" in example  # the transport's own words
    assert example.endswith("(after 1 retries)")
    assert state.requests["drop"] - before == 2 * LIMIT
    assert "connection" in out.splitlines()[0] and "connection" in err


def test_a_200_that_is_not_a_chat_completion_is_a_malformed_reply(tmp_path, server_url, endpoint, capsys):
    url, state = endpoint
    before = state.requests["not-json"]
    code, results, lines, _, err = _eval(tmp_path, server_url, capsys, f"openai:{url}#not-json", "--retries", "2")
    assert code == 3
    _all_failed(results, lines, "malformed_reply")
    assert "not JSON" in results["failures"]["reasons"]["malformed_reply"]["example"]
    assert state.requests["not-json"] - before == LIMIT  # a 200 is not retried
    assert "malformed_reply" in err


def test_a_malformed_tool_call_is_the_models_own_forfeit_and_stays_scored(tmp_path, server_url, endpoint, capsys):
    url, state = endpoint
    before = state.requests["bad-tool-call"]
    code, results, lines, out, err = _eval(tmp_path, server_url, capsys, f"openai-tools:{url}#bad-tool-call")
    assert code == 0 and err == ""
    assert results["scored_problems"] == LIMIT and results["failed_problems"] == 0 and results["accuracy"] == 0.0
    assert results["requests_failed"] == 0 and results["failures"]["reasons"] == {}
    assert results["forfeits"] == {"invalid_tool_call": LIMIT}  # counted apart from failures
    assert results["error_kinds"] == {"missing_final_answer": LIMIT}  # graded by the environment's rules
    assert all(line["turns"][0]["forfeit"] == "invalid_tool_call" and line["rewards"]["episode_reward"] == 0.0
               for line in lines)
    assert state.requests["bad-tool-call"] - before == LIMIT
    assert not out.startswith("FAILED")


def test_play_counts_episodes_the_env_server_refused_and_exits_3(server_url):
    """``mathdebate play`` with episodes the server refuses (``--max-rounds 0`` fails its
    validation): each is a failed episode, typed with the server's message and not scored;
    more than ``--max-failed-share`` of them exits 3, within it 0."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "env_server.cli", "play", "--url", server_url, "--episodes", "3",
               "--no-progress", "--json", "--max-rounds", "0"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr[-2000:]
    first = done.stdout.splitlines()[0]
    assert first.startswith("FAILED: 3 of 3 episodes failed and are not scored: env_validation_error x3")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["episodes"] == 0 and summary["failed"] == 3
    assert summary["failures"]["requests"] == 3 and summary["failures"]["failed"] == 3
    assert list(summary["failures"]["reasons"]) == ["env_validation_error"]
    assert "3 of 3 episodes failed (100.0%, more than --max-failed-share 5%)" in done.stderr
    allowed = subprocess.run([*command, "--max-failed-share", "1"], capture_output=True, text=True, timeout=120)
    assert allowed.returncode == 0 and allowed.stdout.startswith("FAILED: 3 of 3 episodes failed")
