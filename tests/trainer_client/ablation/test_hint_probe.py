"""A tiny model that reads hints: its hint-following warm-up lays hints out as SDPO's teacher
context does, and the hinted policy puts more probability on the correct turn at error sites."""

from __future__ import annotations

import re

import pytest

from env_server.debate.problems import ProblemGenerator
from env_server.debate.problems.splits import VALIDATION_SEED_BASE
from env_server.protocol.markers import HINT_TEMPLATES
from trainer_client.tiny_models.warmup_debates import HINT_MESSAGE, hint_for_turn, synthetic_debates


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


def test_localised_and_reference_hint_styles_put_their_hints_before_the_corrected_turn() -> None:
    """``hint_style``: the solver's and judge's hints are the server's localised hint for a near
    miss (RFC 0002 "Localised hints": a column, never the answer) or the reference solution
    (OPSD); the verifier's stay the templates."""
    from trainer_client.losses.hint_distillation import reference_hint

    for style in ("localised", "reference"):
        debates = synthetic_debates(30, 0, family="two_digit_sum", answer_accuracy=0.0, wrong_answers="near",
                                    seed_base=10**8, worked=True, hint_fraction=0.5, hint_style=style)
        shown = 0
        for messages in debates:
            total = eval_sum(messages[1]["content"])
            for i, message in enumerate(messages):
                if not message.get(HINT_MESSAGE) or message[HINT_MESSAGE].startswith("verifier/"):
                    continue
                shown += 1
                if style == "localised":  # the hint quotes the near miss it localises, never the right sum
                    quoted = re.fullmatch(r"Your final answer (\d+) is not correct: its (ones|tens|ones and tens) "
                                          r"digits? (is|are) wrong\.", message["content"])
                    assert quoted is not None and int(quoted.group(1)) != total
                else:
                    solution = messages[i + 1]["tool_calls"][0]["function"]["arguments"].get("solution")
                    if solution is not None:  # the solver's corrected turn is the reference solution it was shown
                        assert message["content"] == reference_hint(solution)
        assert shown > 5
    # restated: the hint message ends with the turn's own instructions (as sdpo.restate lays it out)
    restated = synthetic_debates(30, 0, family="two_digit_sum", answer_accuracy=0.0, wrong_answers="near",
                                 seed_base=10**8, worked=True, hint_fraction=0.5, hint_style="localised",
                                 restate_hints=True)
    firsts = [m for m in restated if m[2].get(HINT_MESSAGE) == "solver/wrong_answer"]
    assert firsts and all(m[2]["content"].endswith("\n\n" + m[1]["content"]) for m in firsts)
    with pytest.raises(ValueError, match="hint_style"):
        synthetic_debates(1, 0, hint_style="oracle")


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
    from trainer_client.ablation.hint_probe import probe_hints
    from trainer_client.evaluation.heldout import evaluate_first_answers, solver_prompt_ids
    from trainer_client.losses.functional import sequence_logps
    from trainer_client.losses.hint_distillation import hint_message_ids
    from trainer_client.losses.replay_pairs import as_policy_writes, tool_call_message, tool_call_response_ids
    from trainer_client.model.forward import pack_responses, response_logits
    from trainer_client.rollout.chat_template import training_chat_template

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
    per_token, at_token = [], []
    for context in (plain, hinted):
        batch = pack_responses([context], [correct], tokenizer.pad_token_id)
        with torch.no_grad():
            logits = response_logits(model, batch)
        per_token.append(sequence_logps(logits, batch.labels, batch.mask).item() / len(correct))
        steps = torch.log_softmax(logits[0].float(), -1)[batch.mask[0]]  # the correct turn's positions, in order
        if not at_token:  # where the student's greedy choice first leaves the correct turn
            where = next(i for i, (row, right) in enumerate(zip(steps, correct, strict=True)) if int(row.argmax()) != right)
        at_token.append(float(steps[where, correct[where]]))
    single = probe_hints(model, tokenizer, source, [int(problem.problem_id.rsplit("/", 1)[1])], max_new_tokens=96)
    assert single.sites == 1 and single.logp_gain == pytest.approx(per_token[1] - per_token[0], abs=1e-4)
    (site,) = single.per_site  # the per-site figures (scripts/hint_probe.py): the same, and at the right token
    assert site["teacher_advantage"] == pytest.approx(per_token[1] - per_token[0], abs=1e-4)
    assert site["right_token"] == tokenizer.decode([correct[where]])
    assert site["student_logp_right_token"] == pytest.approx(at_token[0], abs=1e-4)
    assert site["teacher_advantage_right_token"] == pytest.approx(at_token[1] - at_token[0], abs=1e-4)
    assert "per_site" not in single.summary() and len(probe.per_site) == probe.sites
    # the trainer's default hints (localised where the family can, restated): only the sites are hinted
    default = probe_hints(model, tokenizer, source, seeds, max_new_tokens=96, style="localised", restate=True)
    assert default.sites == probe.sites and default.right_broken is None
    assert default.accuracy_hinted == pytest.approx(probe.accuracy_unhinted + default.sites_fixed * probe.sites / 40)


@pytest.mark.slow
@pytest.mark.timeout(600)  # two warm-ups: 100 s alone, 250 s beside two other test workers
def test_a_hint_following_warm_up_makes_the_hinted_policy_better_at_error_sites(tmp_path) -> None:
    """The cheap check that hint distillation has something to distil, before any RL: two tiny
    ``two_digit_sum`` models warmed up the same way (the ``tiny-sums`` size and tokenizer, 400
    steps), one with hint-following examples on half of its turns (OPSD's hint: the reference
    solution, the instructions restated after it, as ``sdpo.hint: reference`` lays out the
    teacher's context), one without. On 100 validation problems, at the error sites (the greedy
    first answer is wrong), the hint-trained policy puts more probability on the correct turn when
    shown the hint than without it at nearly every site (measured: +0.075 nats per token, 99 of 99
    sites), the other is thrown off by the same hint (measured: -3.3 nats per token, no site
    higher). docs/ablation/tiny-sums-validation/README.md has the longer warm-ups and RL with them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from env_server.debate.problems import load_problem_source
    from trainer_client.ablation.hint_probe import probe_hints
    from trainer_client.tiny_models.build import build_tiny_model
    from trainer_client.tiny_models.recipes import TinyModelSpec, sums_spec_v1

    source = load_problem_source("gen:two_digit_sum")
    seeds = [VALIDATION_SEED_BASE + i for i in range(100)]
    probes = {}
    for fraction in (0.5, 0.0):
        spec = TinyModelSpec(sums_spec_v1(0), hint_style="reference", restate_hints=True, hint_fraction=fraction,
                             version=2, sft_steps=400, sft_schedule_steps=400)
        target = build_tiny_model(tmp_path / f"hints-{fraction}", spec)
        model, tokenizer = AutoModelForCausalLM.from_pretrained(target), AutoTokenizer.from_pretrained(target)
        probes[fraction] = probe_hints(model, tokenizer, source, seeds, style="reference", restate=True)
    trained, control = probes[0.5], probes[0.0]
    assert trained.sites >= 50 and control.sites >= 50  # both models are mostly wrong this early
    assert trained.logp_gain > 0.02 and trained.share_higher >= 0.8
    assert trained.accuracy_hinted >= trained.accuracy_unhinted
    assert control.logp_gain < -1.0 and control.share_higher <= 0.2


def test_the_hint_probe_command_writes_each_error_site(tmp_path, capsys) -> None:
    """``scripts/hint_probe.py``: the probe's figures on the screen, one JSON line per error site.
    The script's ``main`` runs in this process (a subprocess paid ~12 s of imports again)."""
    import importlib.util
    import json
    from pathlib import Path

    out = tmp_path / "sites.jsonl"
    script = Path(__file__).resolve().parents[3] / "scripts" / "hint_probe.py"
    spec = importlib.util.spec_from_file_location("hint_probe_script", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["tiny-sums", "--n", "6", "--max-new-tokens", "48", "--style", "localised", "--restate",
                        "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    figures = json.loads(stdout[:stdout.index("\n}") + 2])
    sites = [json.loads(line) for line in out.read_text().splitlines()]
    assert figures["problems"] == 6 and len(sites) == figures["sites"] > 0
    assert all(s["problem_id"].startswith("gen/two_digit_sum/") and s["tokens"] > 0 for s in sites)
    assert sum(s["teacher_advantage"] for s in sites) / len(sites) == pytest.approx(figures["logp_gain"], abs=1e-6)
