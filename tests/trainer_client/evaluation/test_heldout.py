"""The held-out evaluation and the easy family of the learning experiment (no model needed)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from env_server.debate.problems import ProblemGenerator, load_problem_source
from env_server.debate.problems.generator import EXTRA_FAMILIES, FAMILIES
from trainer_client.evaluation.heldout import (
    HELDOUT_SEED_BASE,
    grade_answer_text,
    heldout_seeds,
    read_solver_turn,
    solver_prompt_ids,
)
from trainer_client.tiny_models.recipes import LEARNING_WARMUP_SEED_BASE, learning_spec
from trainer_client.tiny_models.warmup_debates import synthetic_debates

ROOT = Path(__file__).resolve().parents[3]


def _call(name: str, arguments: dict[str, str]) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call><|im_end|>'


def test_gen_spec_serves_only_the_named_families() -> None:
    source = load_problem_source("gen:single_digit_sum")
    assert isinstance(source, ProblemGenerator)
    assert source.families == ["single_digit_sum"]
    problem = source.by_seed(HELDOUT_SEED_BASE + 7)
    assert problem.problem_id == f"gen/single_digit_sum/{HELDOUT_SEED_BASE + 7}"
    assert source.get(problem.problem_id) == problem
    a, b = (int(x) for x in problem.problem.removeprefix("Compute $").removesuffix("$.").split(" + "))
    assert 0 <= a <= 9 and 0 <= b <= 9 and problem.answer == str(a + b)
    pair = load_problem_source("gen:gcd_lcm, single_digit_sum")
    assert isinstance(pair, ProblemGenerator)
    assert pair.families == ["gcd_lcm", "single_digit_sum"]
    with pytest.raises(ValueError, match="unknown problem families"):
        load_problem_source("gen:no_such_family")


def test_the_easy_family_is_not_in_the_default_rotation() -> None:
    assert "single_digit_sum" in EXTRA_FAMILIES and "single_digit_sum" not in FAMILIES
    assert ProblemGenerator().families == list(FAMILIES)


def test_no_constant_answer_scores_more_than_10_percent() -> None:
    source = load_problem_source("gen:single_digit_sum")
    answers = Counter(source.by_seed(s).answer for s in heldout_seeds(500))
    best, hits = answers.most_common(1)[0]
    assert hits / 500 <= 0.10, (best, hits)
    assert all(grade_answer_text(source.by_seed(s).answer, best) is (source.by_seed(s).answer == best)
               for s in heldout_seeds(50))


def test_heldout_seeds_are_disjoint_from_warm_up_and_training_seeds() -> None:
    source = load_problem_source("gen:single_digit_sum")
    spec = learning_spec()
    heldout = {source.by_seed(s).problem_id for s in heldout_seeds(500)}
    warm_up_first = LEARNING_WARMUP_SEED_BASE + spec["seed"] * 10**6
    warm_up = {source.by_seed(warm_up_first + i).problem_id for i in range(spec["debates"])}
    training = {source.by_seed(s).problem_id for s in range(1024)}  # config.seed 0 + i, i < dataset_size
    assert not heldout & warm_up and not heldout & training and not warm_up & training
    assert min(heldout_seeds(500)) >= HELDOUT_SEED_BASE > warm_up_first + spec["debates"] > 1024
    debates = synthetic_debates(3, spec["seed"], family=spec["family"], wrong_answers=spec["wrong_answers"],
                                seed_base=warm_up_first)
    shown = [debate[1]["content"] for debate in debates]
    assert all(source.by_seed(warm_up_first + i).problem in text for i, text in enumerate(shown))


def test_a_correct_tool_call_is_graded_correct() -> None:
    text = _call("submit_solution", {"solution": "$3 + 4 = 7$. So the answer is $\\boxed{7}$."})
    turn = read_solver_turn(text)
    assert turn.tool == "submit_solution" and turn.valid and turn.answer == "7"
    assert grade_answer_text("7", turn.answer) is True
    assert grade_answer_text("8", turn.answer) is False
    assert grade_answer_text("\\frac{1}{2}", "0.5") is True  # the server's grader, not string equality


@pytest.mark.parametrize("text", [
    "So the answer is \\boxed{7}.<|im_end|>",  # no tool call
    '<tool_call>\n{"name": "submit_solution", "arguments": {"solution": "\\\\boxed{7}"}\n</tool_call>',  # bad JSON
    '<tool_call>\n{"name": "submit_solution", "arguments": {"solution": "\\\\boxed{7}"}}',  # unclosed call
    _call("submit_verdict", {"verdict": "CORRECT", "critique": "\\boxed{7}"}),  # the wrong tool
    _call("submit_solution", {"answer": "\\boxed{7}"}),  # the wrong argument
    _call("submit_solution", {"solution": "The answer is 7."}),  # no boxed answer
    _call("submit_solution", {"solution": "\\boxed{7"}),  # unclosed box
    "<|im_end|>" + _call("submit_solution", {"solution": "\\boxed{7}"}),  # after the end of the turn
])
def test_malformed_turns_are_format_invalid(text: str) -> None:
    turn = read_solver_turn(text)
    assert not turn.valid and turn.answer is None


def test_the_prompt_is_the_tool_loops_prompt() -> None:
    """The evaluator's prompt equals the prompt of a warm-up rollout (``rollout_tokens``'s
    layout of TRL's tool loop) for the same problem."""
    from transformers import PreTrainedTokenizerFast

    from trainer_client.rollout.tool_calls import tool_callables
    from trainer_client.tiny_models.build import SPECIAL_TOKENS, _train_tokenizer, rollout_tokens

    trl = pytest.importorskip("trl")
    from pathlib import Path

    template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    tokenizer = _train_tokenizer(SPECIAL_TOKENS, 300, template)
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    spec = learning_spec()
    first = LEARNING_WARMUP_SEED_BASE
    debate = synthetic_debates(1, spec["seed"], family=spec["family"], wrong_answers=spec["wrong_answers"],
                               seed_base=first)[0]
    tools = tool_callables()
    ids, mask = rollout_tokens(tokenizer, debate, tools)
    prompt = solver_prompt_ids(tokenizer, load_problem_source("gen:single_digit_sum").by_seed(first), tools)
    assert ids[:len(prompt)] == prompt and mask[len(prompt) - 1] == 0 and mask[len(prompt)] == 1


def test_whole_debates_agree_with_the_first_answer_path_and_the_servers_rule(tiny_learning_dir) -> None:
    """Greedy whole debates: the solver's first answer is graded as the first-answer path grades
    it (same greedy turn), every ``G`` is 0 or 1, and with the judge copying the solver (what the
    warm-up taught it) ``G`` follows the first answer on most problems."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer_client.evaluation.episode_eval import evaluate_episodes
    from trainer_client.evaluation.heldout import evaluate_first_answers

    model = AutoModelForCausalLM.from_pretrained(tiny_learning_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_learning_dir)
    source, seeds = load_problem_source("gen:single_digit_sum"), heldout_seeds(24, start=700_000)
    first = evaluate_first_answers(model, tokenizer, source, seeds)
    transcripts: list[dict] = []
    debates = evaluate_episodes(model, tokenizer, source, seeds, batch_size=10, transcripts=transcripts)
    assert debates.n == 24 and set(debates.episode_rewards) <= {0.0, 1.0}
    # the transcripts are the debates scored: one per debate, in order, each turn's own text and verdict
    assert [t["problem_id"] for t in transcripts] == [source.by_seed(s).problem_id for s in seeds]
    assert [t["record"]["episode_reward"] for t in transcripts] == debates.episode_rewards
    for transcript in transcripts:
        for turn in transcript["turns"]:
            if turn["valid_call"]:
                assert turn["generated"].startswith("<tool_call>") and turn["content"]
            if turn["role"] == "verifier":
                assert turn["verdict"] in (None, "CORRECT", "INCORRECT")
                assert (turn["verdict"] is None) == (transcript["record"]["turns"][turn["t"]]["error_kind"]
                                                     == "missing_verdict")
    # scripts/verifier_audit.py reads them: every verifier turn sorted once, the figures the report's
    import importlib.util

    spec = importlib.util.spec_from_file_location("verifier_audit", ROOT / "scripts" / "verifier_audit.py")
    audit_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(audit_module)
    audited = audit_module.audit(transcripts, examples=1)
    assert sum(audited["verifier_turns"].values()) == audited["figures"]["verifier_turns"] > 0
    assert audited["figures"]["balanced_verdict_accuracy"] == debates.balanced_verdict_accuracy
    assert audited["reviewed_not_the_previous_turn"] == 0 and audited["polarity_mismatches"] == 0
    assert first.valid_rate == 1.0 and debates.first_answer_correct == [r.correct for r in first.records]
    assert debates.finished_rate >= 0.9
    agree = sum(g == float(c) for g, c in zip(debates.episode_rewards, debates.first_answer_correct, strict=True))
    assert agree >= 20, (debates.episode_rewards, debates.first_answer_correct)
    # single mode: one solver turn under the single-mode prompt; every episode's reward is its
    # answer's correctness and there is no judge. (This model's warm-up had no single-mode
    # episode, so it may call another role's tool there: the first-answer path counts that
    # invalid, the episode path submits the text, as the training adapter does; they agree on
    # valid calls.)
    single_first = evaluate_first_answers(model, tokenizer, source, seeds, batch_size=10, mode="single")
    single = evaluate_episodes(model, tokenizer, source, seeds, batch_size=10, mode="single")
    assert single.n == 24 and single.judge_accuracy is None
    assert single.episode_rewards == [float(c) for c in single.first_answer_correct]
    assert all(c == r.correct for c, r in zip(single.first_answer_correct, single_first.records, strict=True) if r.valid)


def test_single_mode_evaluation_prompts_with_the_single_mode_instructions() -> None:
    """A policy trained in single mode saw the single-mode solver instructions (the server's
    reset observation for ``mode: single``, rendered by the training adapter): the held-out
    prompt for ``mode="single"`` holds exactly those, and differs from the debate prompt."""
    from transformers import PreTrainedTokenizerFast

    from env_server.debate.episode import DebateEpisode
    from env_server.debate.prompts import SINGLE_SOLVER_PROMPT
    from env_server.protocol.markers import EpisodeMode
    from env_server.protocol.models import DebateObservation
    from trainer_client.evaluation.heldout import observation_prompt_ids
    from trainer_client.rollout.tool_calls import tool_callables
    from trainer_client.tiny_models.build import SPECIAL_TOKENS, _train_tokenizer

    trl = pytest.importorskip("trl")
    from pathlib import Path

    template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    tokenizer = _train_tokenizer(SPECIAL_TOKENS, 300, template)
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    problem, tools = load_problem_source("gen:single_digit_sum").by_seed(HELDOUT_SEED_BASE), tool_callables()
    served = DebateEpisode("e", problem, max_rounds=1, max_action_chars=4096, mode=EpisodeMode.SINGLE)
    observation = DebateObservation.model_validate(json.loads(served.last_observation)["observation"])
    single = solver_prompt_ids(tokenizer, problem, tools, mode="single")
    assert single == observation_prompt_ids(tokenizer, observation, tools)
    assert SINGLE_SOLVER_PROMPT in tokenizer.decode(single) and single != solver_prompt_ids(tokenizer, problem, tools)


def test_sampled_debates_and_the_debates_own_figures(tmp_path) -> None:
    """``evaluate_episodes`` with ``k`` samples per problem (the sampled final accuracy) on the
    protocol's committed start: ``k`` debates per problem in problem order, reproducible from
    its seed, and the debate's own figures consistent with the per-debate outcomes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer_client.evaluation.episode_eval import evaluate_episodes
    from trainer_client.evaluation.policy_eval import evaluate_policy
    from trainer_client.tiny_models.build import tiny_model_path

    path = tiny_model_path("tiny-sums", tmp_path)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    source, seeds = load_problem_source("gen:two_digit_sum"), heldout_seeds(12, start=500_000)
    sampled = evaluate_episodes(model, tokenizer, source, seeds, k=3, temperature=0.7, sample_seed=5)
    again = evaluate_episodes(model, tokenizer, source, seeds, k=3, temperature=0.7, sample_seed=5)
    assert sampled.n == 12 and sampled.k == 3 and len(sampled.episode_rewards) == 36
    assert sampled.episode_rewards == again.episode_rewards and sampled.temperature == 0.7
    firsts, finals = sampled.first_answer_correct, sampled.episode_rewards
    assert sampled.wrong_to_right == pytest.approx(sum((not f) and g == 1 for f, g in zip(firsts, finals, strict=True)) / 36)
    assert sampled.right_to_wrong == pytest.approx(sum(f and g == 0 for f, g in zip(firsts, finals, strict=True)) / 36)
    assert sampled.first_answer_accuracy == pytest.approx(sum(firsts) / 36)
    assert sampled.per_problem_final() == [sum(finals[3 * i:3 * i + 3]) / 3 for i in range(12)]
    assert sampled.balanced_verdict_accuracy == pytest.approx(
        (sampled.verdict_accuracy_right + sampled.verdict_accuracy_wrong) / 2)
    greedy = evaluate_episodes(model, tokenizer, source, seeds)
    assert greedy.k == 1 and greedy.temperature is None and len(greedy.episode_rewards) == 12
    # one call, every figure: the greedy debates are the same debates
    figures = evaluate_policy(model, tokenizer, source, seeds, k=2, debate_k=3, temperature=0.7, sample_seed=5)
    assert figures.figures["final_accuracy"] == greedy.episode_reward
    assert figures.per_problem["sampled_final_accuracy"] == sampled.per_problem_final()
    assert len(figures.per_problem["sampled_accuracy"]) == 12 and figures.figures["k"] == 2
    single = evaluate_policy(model, tokenizer, source, seeds, k=0, temperature=0.7, mode="single")
    assert single.figures["sampled_accuracy"] is None and single.figures["balanced_verdict_accuracy"] is None
    assert set(single.per_problem) == {"accuracy", "final_accuracy"}


def test_inference_tokens_and_the_majority_vote_by_hand(tiny_learning_dir) -> None:
    """The tokens each answer costs (a single unpadded greedy generation gives the same count),
    the majority vote over the first m samples (by hand: the most frequent answer, ties to the
    first seen, for integer answers where the grader's clusters are string equality), and a
    single-mode episode costing exactly its greedy first answer's tokens."""
    from collections import Counter

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer_client.evaluation.episode_eval import evaluate_episodes
    from trainer_client.evaluation.heldout import evaluate_first_answers, solver_prompt_ids
    from trainer_client.rollout.tool_calls import tool_callables

    model = AutoModelForCausalLM.from_pretrained(tiny_learning_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_learning_dir)
    source, seeds = load_problem_source("gen:single_digit_sum"), heldout_seeds(4, start=710_000)
    report = evaluate_first_answers(model, tokenizer, source, seeds, k=4, temperature=1.0, batch_size=4)
    for seed, record in zip(seeds, report.records, strict=True):
        prompt = solver_prompt_ids(tokenizer, source.by_seed(seed), tool_callables(), 1, "debate")
        with torch.inference_mode():
            out = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=96, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        assert record.tokens == out.shape[1] - len(prompt)
        assert len(record.sample_tokens) == 4 and all(1 <= t <= 96 for t in record.sample_tokens)
        for m in range(1, 5):
            given = [a for a in record.sample_answers[:m] if a is not None]
            if not given:
                assert not record.majority_correct[m - 1]
                continue
            counts = Counter(given)
            top = max(counts.values())
            winner = next(a for a in given if counts[a] == top)
            assert record.majority_correct[m - 1] == (winner == record.gold), (m, record.sample_answers, record.gold)
    assert report.majority_accuracy_by_k == [sum(r.majority_correct[m] for r in report.records) / 4 for m in range(4)]
    assert report.majority_accuracy_by_k[0] == pytest.approx(
        sum(r.sample_correct[0] for r in report.records) / 4)  # a vote of one sample is that sample
    assert report.mean_tokens == sum(r.tokens for r in report.records) / 4
    assert report.mean_sample_tokens == sum(t for r in report.records for t in r.sample_tokens) / 16
    single = evaluate_episodes(model, tokenizer, source, seeds, batch_size=4, mode="single")
    greedy_single = evaluate_first_answers(model, tokenizer, source, seeds, batch_size=4, mode="single")
    assert single.mean_tokens == greedy_single.mean_tokens > 0
    debates = evaluate_episodes(model, tokenizer, source, seeds, batch_size=4)
    assert debates.mean_tokens > report.mean_tokens  # a debate costs its first answer and more turns
