"""``mathdebate eval``: strategies, policies and outputs, against a real env server and a real
local OpenAI-compatible endpoint (``tests/helpers/openai_fixture.py``), and with the tiny HF model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from openai_fixture import serve_chat_fixture
from provenance_checks import check_provenance

from env_server.debate.problems import load_problem_source
from trainer_client.cli import main
from trainer_client.evaluation.heldout import grade_answer_text
from trainer_client.evaluation.openai_policy import accept_prob_from_logprobs
from trainer_client.evaluation.selection import best_of_n_choice, self_consistency_choice, self_consistency_clusters

LIMIT = 6


# --------------------------------------------------------------------------- selection rules


def test_best_of_n_takes_the_highest_score_and_the_lowest_index_on_ties():
    assert best_of_n_choice([0.2, 0.9, 0.9, 0.1]) == 1
    assert best_of_n_choice([None, 0.0, None]) == 1
    assert best_of_n_choice([None, None]) == 0
    with pytest.raises(ValueError):
        best_of_n_choice([])


def test_self_consistency_clusters_with_the_first_member_as_gold():
    answers = ["3", "\\frac12", "0.5", None, "3", "1/2", "7"]
    # "\frac12" opens a cluster that "0.5" and "1/2" join (graded against "\frac12" as gold);
    # the missing answer does not vote.
    assert self_consistency_clusters(answers, grade_answer_text) == [[0, 4], [1, 2, 5], [6]]
    assert self_consistency_choice(answers, grade_answer_text) == (1, 3)
    # a tie goes to the cluster whose first member came first
    assert self_consistency_choice(["5", "4", "4", "5"], grade_answer_text) == (0, 2)
    assert self_consistency_choice([None, None], grade_answer_text) == (0, 0)


def test_verdict_probability_from_endpoint_logprobs():
    top = [{"token": " CORRECT", "logprob": math.log(0.6)}, {"token": " INCORRECT", "logprob": math.log(0.3)},
           {"token": " maybe", "logprob": math.log(0.1)}]
    tokens = [{"token": "Fine.\nVERDICT", "logprob": -1.0, "top_logprobs": []},
              {"token": ":", "logprob": -0.1, "top_logprobs": []},
              {"token": " CORRECT", "logprob": math.log(0.6), "top_logprobs": top}]
    assert accept_prob_from_logprobs(tokens) == pytest.approx(0.6 / 0.9)
    # "IN" is the start of INCORRECT only; no marker: unknown
    assert accept_prob_from_logprobs([*tokens[:2], {"token": " IN", "logprob": -0.1, "top_logprobs": [
        {"token": " IN", "logprob": math.log(0.5)}, {"token": " CORR", "logprob": math.log(0.5)}]}]) == 0.5
    assert accept_prob_from_logprobs([{"token": "CORRECT", "logprob": 0.0, "top_logprobs": []}]) is None


# --------------------------------------------------------------------------- the command, end to end


@pytest.fixture(scope="module")
def chat_endpoint():
    source = load_problem_source(None)  # the built-in generator the session server serves
    gold = {p.problem: p.answer for p in (source.by_seed(i) for i in range(LIMIT))}
    with serve_chat_fixture(gold) as served:
        yield served


def _eval(tmp_path: Path, server_url: str, *args: str) -> dict:
    out = tmp_path / "eval"
    code = main(["eval", "--env-url", server_url, "--limit", str(LIMIT), "--output-dir", str(out), "--no-progress",
                 "--concurrency", "4", *args])
    assert code == 0
    return json.loads((out / "results.json").read_text())


def _trajectories(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "eval" / "trajectories.jsonl").read_text().splitlines()]


def test_greedy_debate_with_one_endpoint_for_every_role(tmp_path, server_url, chat_endpoint):
    url, fixture = chat_endpoint
    before = fixture.requests["oracle"]
    results = _eval(tmp_path, server_url, "--policy", f"openai:{url}#oracle")
    assert results["accuracy"] == 1.0 and results["n_problems"] == LIMIT
    check_provenance(results["provenance"], [load_problem_source(None).fingerprint()])  # the session server
    assert results["provenance"]["env_servers"][0]["url"] == server_url
    assert results["provenance"]["config"]["policy"] == f"openai:{url}#oracle"
    assert results["mode"] == "debate" and results["strategy"] == "greedy"
    assert results["accuracy_ci95"][0] < 1.0 == pytest.approx(results["accuracy_ci95"][1])
    assert results["per_role"]["verifier"]["reward"] == 1.0 and results["judge_accuracy"] == 1.0
    assert results["mean_turns"] == 3.0 and results["requests_failed"] == 0
    assert fixture.requests["oracle"] - before == 3 * LIMIT  # solver, verifier, judge per debate
    usage = results["requests"][f"openai:{url}#oracle"]
    assert usage["requests"] == 3 * LIMIT and usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    lines = _trajectories(tmp_path)
    assert len(lines) == LIMIT and all(line["chosen"] for line in lines)
    first = lines[0]
    # the server's trajectory-log schema plus the problem and each turn's messages
    assert {"episode_id", "problem_id", "turns", "rewards", "problem", "gold"} <= set(first)
    assert [t["role"] for t in first["turns"]] == ["solver", "verifier", "judge"]
    assert first["turns"][1]["messages"][0]["content"].startswith("You are the verifier")
    assert first["rewards"]["episode_reward"] == 1.0


def test_per_role_endpoints_and_single_mode(tmp_path, server_url, chat_endpoint):
    url, _ = chat_endpoint
    results = _eval(tmp_path, server_url, "--policy", f"openai:{url}#oracle", "--policy-solver", f"openai:{url}#wrong")
    assert results["accuracy"] == 0.0 and results["first_answer_accuracy"] == 0.0
    assert results["policies"]["solver"].endswith("#wrong") and results["policies"]["judge"].endswith("#oracle")
    assert results["error_kinds"]["wrong_answer"] >= LIMIT
    assert results["per_role"]["verifier"]["reward"] == 1.0  # the oracle verifier rejects every wrong answer

    single = _eval(tmp_path, server_url, "--mode", "single", "--policy-solver", f"openai:{url}#oracle")
    assert single["accuracy"] == 1.0 and single["mode"] == "single" and single["judge_accuracy"] is None
    assert list(single["policies"]) == ["solver"] and single["mean_turns"] == 1.0
    assert all(len(line["turns"]) == 1 for line in _trajectories(tmp_path))


@pytest.mark.parametrize("mode", ["debate", "single"])
def test_best_of_n_picks_by_the_verifiers_logprobs(tmp_path, server_url, chat_endpoint, mode):
    url, fixture = chat_endpoint
    seen = len(fixture.bodies)
    results = _eval(tmp_path, server_url, "--mode", mode, "--strategy", "best_of_n", "--n", "4", "--max-rounds", "1",
                    "--policy", f"openai:{url}#oracle", "--policy-solver", f"openai:{url}#sampler",
                    "--policy-verifier", f"openai:{url}#verifier-logprobs")
    # half the samples are right; P(CORRECT) = 0.9 for those, 0.2 for the others
    assert results["sample_accuracy"] == 0.5 and results["pass_at_n"] == 1.0 and results["accuracy"] == 1.0
    lines = _trajectories(tmp_path)
    assert len(lines) == 4 * LIMIT
    assert {line["score_source"] for line in lines} == {"logprobs"}
    assert sorted({line["score"] for line in lines}) == pytest.approx([0.2, 0.9])
    assert all(line["rewards"]["episode_reward"] == 1.0 for line in lines if line["chosen"])
    assert results["scoring_episodes"] == (4 * LIMIT if mode == "single" else 0)
    # each sample's request carries its own seed (endpoints that honour it would repeat a sample otherwise)
    solver = [b for b in fixture.bodies[seen:] if b["model"] == "sampler"]
    assert len(solver) == 4 * LIMIT and len({b["seed"] for b in solver}) == 4 * LIMIT
    assert {b["temperature"] for b in solver} == {1.0}


def test_best_of_n_falls_back_to_the_acceptance_rate(tmp_path, server_url, chat_endpoint):
    url, _ = chat_endpoint
    results = _eval(tmp_path, server_url, "--strategy", "best_of_n", "--n", "2", "--verifier-samples", "3", "--max-rounds", "1",
                    "--policy", f"openai:{url}#oracle", "--policy-solver", f"openai:{url}#sampler")
    assert results["accuracy"] == 1.0 and results["sample_accuracy"] == 0.5
    lines = _trajectories(tmp_path)
    assert {line["score_source"] for line in lines} == {"acceptance_rate"}
    assert sorted({line["score"] for line in lines}) == [0.0, 1.0]  # the oracle verifier is unanimous


def test_best_of_n_picks_by_a_user_reward_function(tmp_path, server_url, chat_endpoint, monkeypatch):
    url, _ = chat_endpoint
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "helpers"))  # the worker imports reward_fns by path
    results = _eval(tmp_path, server_url, "--mode", "single", "--strategy", "best_of_n", "--n", "2",
                    "--select", "reward:reward_fns:first_answer_is_gold", "--policy", f"openai:{url}#sampler")
    assert results["accuracy"] == 1.0 and results["sample_accuracy"] == 0.5 and results["scoring_episodes"] == 0
    lines = _trajectories(tmp_path)
    assert {line["score_source"] for line in lines} == {"reward_function"}
    assert all(line["score"] == float(line["rewards"]["episode_reward"]) for line in lines)


def test_self_consistency_votes_over_final_answers(tmp_path, server_url, chat_endpoint):
    url, _ = chat_endpoint
    results = _eval(tmp_path, server_url, "--mode", "single", "--strategy", "self_consistency", "--n", "5",
                    "--policy", f"openai:{url}#sampler")
    # 3 of 5 samples carry the gold answer, 2 distinct wrong answers: the vote is right every time
    assert results["sample_accuracy"] == pytest.approx(0.6) and results["accuracy"] == 1.0
    assert results["mean_votes"] == 3.0 and results["pass_at_n"] == 1.0


def test_a_failed_request_fails_its_episode_and_the_run_goes_on(tmp_path, server_url, chat_endpoint, capsys):
    """A verifier endpoint answering 500 (retried once): every debate fails at the verifier's
    turn, is left out of every accuracy (not graded as a missing verdict), and the run says so
    and exits 3 (tests/e2e/test_eval_failures.py has each way of failing)."""
    url, fixture = chat_endpoint
    before = fixture.requests["broken"]
    out = tmp_path / "eval"
    code = main(["eval", "--env-url", server_url, "--limit", str(LIMIT), "--output-dir", str(out), "--no-progress",
                 "--concurrency", "4", "--policy", f"openai:{url}#oracle", "--policy-verifier", f"openai:{url}#broken",
                 "--retries", "1"])
    assert code == 3
    results = json.loads((out / "results.json").read_text())
    assert results["requests_failed"] == LIMIT and results["episodes_failed"] == LIMIT
    assert results["failed_problems"] == LIMIT and results["accuracy"] is None and results["error_kinds"] == {}
    assert results["failures"]["reasons"] == {"http_500": {"count": LIMIT,
                                                           "example": "fixture: broken model (after 1 retries)"}}
    assert fixture.requests["broken"] - before == 2 * LIMIT  # one try and one retry per turn
    assert all(line["turns"][1]["forfeit"] == "request_failed" and "500" in line["turns"][1]["error"]
               and line["rewards"] is None for line in _trajectories(tmp_path))
    assert capsys.readouterr().out.startswith(f"FAILED: {LIMIT} of {LIMIT} episodes failed")

    before = fixture.requests["flaky"]
    flaky = _eval(tmp_path, server_url, "--mode", "single", "--policy", f"openai:{url}#flaky", "--retries", "2")
    assert flaky["requests_failed"] == 0 and flaky["accuracy"] == 1.0 and flaky["failed_problems"] == 0
    assert fixture.requests["flaky"] - before == 2 * LIMIT  # each first try failed, its retry succeeded


def test_api_key_comes_from_the_named_environment_variable(tmp_path, server_url, chat_endpoint, monkeypatch, capsys):
    url, fixture = chat_endpoint
    monkeypatch.delenv("FIXTURE_KEY", raising=False)
    code = main(["eval", "--env-url", server_url, "--limit", "1", "--policy", f"openai:{url}", "--model", "oracle",
                 "--api-key-env", "FIXTURE_KEY", "--output-dir", str(tmp_path / "x"), "--no-progress"])
    assert code == 2 and "FIXTURE_KEY" in capsys.readouterr().err
    monkeypatch.setenv("FIXTURE_KEY", "s3cret")
    seen = len(fixture.authorization)
    results = _eval(tmp_path, server_url, "--mode", "single", "--policy", f"openai:{url}", "--model", "oracle",
                    "--api-key-env", "FIXTURE_KEY")
    assert results["accuracy"] == 1.0
    assert set(fixture.authorization[seen:]) == {"Bearer s3cret"}


def test_bad_policy_specs_exit_2(tmp_path, server_url, capsys):
    for spec in ("gpt4", "scripted:noisy:2", "openai:http://x/v1"):
        assert main(["eval", "--env-url", server_url, "--policy", spec, "--output-dir", str(tmp_path)]) == 2
        assert "mathdebate eval:" in capsys.readouterr().err


def test_scripted_policy_on_math500_with_its_own_server(tmp_path, math500_path):
    out = tmp_path / "m500"
    assert main(["eval", "--policy", "scripted:reference", "--problems", str(math500_path), "--limit", "12",
                 "--output-dir", str(out), "--no-progress"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["accuracy"] == 1.0 and results["n_problems"] == 12
    check_provenance(results["provenance"], [load_problem_source(str(math500_path)).fingerprint()])  # its own server
    lines = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert [line["problem_id"] for line in lines] == [load_problem_source(str(math500_path)).by_seed(i).problem_id
                                                      for i in range(12)]


def test_hf_policy_plays_debates_as_the_heldout_evaluation_does(tmp_path, tiny_learning_dir):
    """The tiny learning model through ``hf:``: the same greedy debates, turn for turn, as
    ``episode_eval.evaluate_episodes`` (the learning experiment's evaluation) plays locally."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer_client.evaluation.episode_eval import evaluate_episodes
    from trainer_client.evaluation.heldout import HELDOUT_SEED_BASE, heldout_seeds

    n = 8
    out = tmp_path / "hf"
    assert main(["eval", "--policy", f"hf:{tiny_learning_dir}", "--problems", "gen:single_digit_sum",
                 "--seed", str(HELDOUT_SEED_BASE), "--limit", str(n), "--max-rounds", "1", "--max-new-tokens", "96",
                 "--batch-size", str(n), "--concurrency", str(n), "--output-dir", str(out), "--no-progress"]) == 0
    results = json.loads((out / "results.json").read_text())
    lines = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_learning_dir), AutoTokenizer.from_pretrained(
        tiny_learning_dir)
    local = evaluate_episodes(model, tokenizer, load_problem_source("gen:single_digit_sum"), heldout_seeds(n),
                              max_rounds=1, batch_size=n)
    assert [line["rewards"]["episode_reward"] for line in lines] == local.episode_rewards
    assert [line["rewards"]["facts"]["first_answer_correct"] for line in lines] == local.first_answer_correct
    assert results["accuracy"] == pytest.approx(local.episode_reward)
    assert results["requests"][f"hf:{tiny_learning_dir}"]["completion_tokens"] > 0
    assert all(line["turns"][0]["generated"].startswith("<tool_call>") for line in lines)

    # best-of-N with the model as its own verifier: P(CORRECT) read from its verdict token
    out = tmp_path / "hf-bon"
    assert main(["eval", "--policy", f"hf:{tiny_learning_dir}", "--problems", "gen:single_digit_sum",
                 "--seed", str(HELDOUT_SEED_BASE), "--limit", "3", "--max-rounds", "1", "--max-new-tokens", "96",
                 "--strategy", "best_of_n", "--n", "2", "--batch-size", "1", "--output-dir", str(out), "--no-progress"]) == 0
    lines = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    with_verdict = [line for line in lines if "VERDICT: " in line["turns"][1]["content"]]
    assert with_verdict and all(line["score_source"] == "logprobs" and 0.0 < line["score"] < 1.0
                                for line in with_verdict)
    for k in range(3):  # the chosen sample has the highest score of its problem (ties: the first)
        group = lines[2 * k:2 * k + 2]
        scores = [line["score"] if line["score"] is not None else -1.0 for line in group]
        assert [line["chosen"] for line in group] == [scores[0] >= scores[1], scores[0] < scores[1]]
