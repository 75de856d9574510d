"""A tiny model that reads hints: its hint-following warm-up lays hints out as SDPO's teacher
context does, and the hinted policy puts more probability on the correct turn at error sites."""

from __future__ import annotations

import pytest

from env_server.debate.problems import ProblemGenerator
from env_server.debate.problems.splits import VALIDATION_SEED_BASE
from env_server.protocol.markers import HINT_TEMPLATES
from trainer_client.experiments.warmup_debates import HINT_MESSAGE, hint_for_turn, synthetic_debates


def test_hint_following_examples_put_the_hint_before_a_corrected_turn() -> None:
    debates = synthetic_debates(60, 0, family="two_digit_sum", answer_accuracy=0.0, wrong_answers="near",
                                seed_base=10**8, worked=True, hint_fraction=0.5)
    hinted = 0
    for messages in debates:
        for i, message in enumerate(messages):
            if not message.get(HINT_MESSAGE):
                continue
            hinted += 1
            assert message["role"] == "user" and message["content"] == HINT_TEMPLATES[message[HINT_MESSAGE]]
            call = messages[i + 1]["tool_calls"][0]["function"]
            problem = messages[1]["content"]
            if call["name"] == "submit_solution":  # the solver, always wrong unhinted here, is right after a hint
                assert message[HINT_MESSAGE] == "solver/wrong_answer"
                assert call["arguments"]["solution"].endswith(f"{{{eval_sum(problem)}}}$.")
            elif call["name"] == "submit_final_answer":
                assert call["arguments"]["answer"] == str(eval_sum(problem))
            else:  # the verifier: the hint names the error it would make, the verdict is the right one
                verdict = call["arguments"]["verdict"]
                assert message[HINT_MESSAGE] == hint_for_turn("verifier", verdict == "CORRECT")
    assert 40 <= hinted <= 140  # about half of 180 turns
    # no hints: the debates are exactly the original recipe's
    assert synthetic_debates(5, 3, family="two_digit_sum", seed_base=10**8) == synthetic_debates(
        5, 3, family="two_digit_sum", seed_base=10**8, hint_fraction=0.0)
    with pytest.raises(ValueError, match="hint_fraction"):
        synthetic_debates(1, 0, hint_fraction=1.5)


def eval_sum(problem_text: str) -> int:
    """The sum in a two_digit_sum prompt (the digits around the ``+`` of ``$a + b$``)."""
    expression = problem_text.split("Compute $", 1)[1].split("$", 1)[0]
    a, b = expression.split(" + ")
    return int(a) + int(b)


@pytest.mark.timeout(300)
def test_the_probe_compares_hinted_and_unhinted_turns_at_the_error_sites(tiny_learning_dir) -> None:
    """The probe on a real policy (the first protocol's tiny model, 40 validation problems): its
    sites are the problems the greedy unhinted turn gets wrong, its accuracies are greedy
    first-answer accuracies (the unhinted one equals the held-out evaluator's), and its
    log-probability gain is, per site, the correct turn's per-token log-probability with the hint
    minus without (checked by hand for one site). Whether a model reads hints is measured with it
    (README "Does it learn?": on tiny-sums the hint makes the correct turn less likely)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from env_server.protocol.markers import Role
    from trainer_client.experiments.heldout import evaluate_first_answers, solver_prompt_ids
    from trainer_client.experiments.hint_probe import probe_hints
    from trainer_client.experiments.tiny_model import training_chat_template
    from trainer_client.losses.functional import sequence_logps
    from trainer_client.losses.hint_distillation import hint_message_ids
    from trainer_client.losses.replay_pairs import as_policy_writes, tool_call_message, tool_call_response_ids
    from trainer_client.model.forward import pack_responses, response_logits

    model = AutoModelForCausalLM.from_pretrained(tiny_learning_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_learning_dir)
    source = ProblemGenerator(families=["single_digit_sum"])
    seeds = [VALIDATION_SEED_BASE + i for i in range(40)]
    probe = probe_hints(model, tokenizer, source, seeds, max_new_tokens=96)
    report = evaluate_first_answers(model, tokenizer, source, seeds)
    wrong = [r for r in report.records if not r.correct]
    assert probe.problems == 40 and probe.sites == len(wrong) and probe.accuracy_unhinted == report.accuracy
    assert 0 < probe.sites < 40 and 0.0 <= probe.share_higher <= 1.0

    # one site by hand: the same two contexts and the same correct turn, scored one at a time
    template = training_chat_template(tokenizer)
    problem = source.get(wrong[0].problem_id)
    plain = solver_prompt_ids(tokenizer, problem)
    generation_prompt, inserted = hint_message_ids(tokenizer, HINT_TEMPLATES["solver/wrong_answer"],
                                                   chat_template=template)
    hinted = plain[: len(plain) - len(generation_prompt)] + inserted
    message = tool_call_message(Role.SOLVER, problem.solution)
    correct = as_policy_writes(tokenizer, tool_call_response_ids(tokenizer, message, chat_template=template,
                                                                 eos_token_id=tokenizer.eos_token_id), [])
    per_token = []
    for context in (plain, hinted):
        batch = pack_responses([context], [correct], tokenizer.pad_token_id)
        with torch.no_grad():
            per_token.append(sequence_logps(response_logits(model, batch), batch.labels, batch.mask).item() / len(correct))
    single = probe_hints(model, tokenizer, source, [int(problem.problem_id.rsplit("/", 1)[1])], max_new_tokens=96)
    assert single.sites == 1 and single.logp_gain == pytest.approx(per_token[1] - per_token[0], abs=1e-4)
