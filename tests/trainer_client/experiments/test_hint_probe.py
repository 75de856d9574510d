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


@pytest.mark.timeout(600)
def test_a_hint_reading_warm_up_makes_the_hinted_policy_better_at_error_sites(tiny_learning_dir, tmp_path) -> None:
    """The tiny-learning recipe with hint-following examples (a quarter of the turns) and a
    solver that is wrong 30% of the time unhinted: on validation problems, at the error sites
    (greedy unhinted answer wrong) the correct turn is likelier with the hint than without.
    The same probe on tiny-learning, whose warm-up never showed a hint, is the contrast."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer_client.experiments.hint_probe import probe_hints
    from trainer_client.experiments.tiny_model import TinyModelSpec, build_tiny_model, learning_spec

    spec = TinyModelSpec(learning_spec(), version=8, hint_fraction=0.25, answer_accuracy=0.7)
    reading = build_tiny_model(tmp_path / "hints", spec)
    source = ProblemGenerator(families=["single_digit_sum"])
    seeds = [VALIDATION_SEED_BASE + i for i in range(120)]
    probes = {}
    for name, path in (("reads hints", reading), ("never saw a hint", tiny_learning_dir)):
        model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
        probes[name] = probe_hints(model, tokenizer, source, seeds)
    reads, never = probes["reads hints"], probes["never saw a hint"]
    assert reads.sites >= 10, probes
    assert reads.logp_gain > 0.05 and reads.share_higher > 0.6, probes
    assert reads.logp_gain > never.logp_gain + 0.05, probes
