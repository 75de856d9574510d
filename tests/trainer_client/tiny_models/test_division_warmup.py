"""The ``exact_division`` warm-up (issue 54's family where checking is cheaper than solving): each
role's working and slip computed by hand, and scripted debates whose verdicts follow from the
product check."""

from __future__ import annotations

import re

import pytest

from env_server.debate.error_sites import localised_hint
from env_server.debate.problems import ProblemGenerator
from env_server.debate.problems.generator import long_division_steps
from trainer_client.tiny_models.warmup_debates import (
    DivisionWorking,
    division_fact_drills,
    division_facts,
    division_solution,
    product_check,
    product_of,
    synthetic_debates,
)


def test_the_solver_s_slip_drops_the_tens_step_s_remainder() -> None:
    # 455 / 7: 45 / 7 = 6 remainder 3; 35 / 7 = 5. Dropping the 3: 5 / 7 = 0, so 60.
    assert division_solution(455, 7) == (r"Tens: $45 \div 7 = 6$ remainder $3$. Ones: $35 \div 7 = 5$. "
                                         r"So $455 \div 7 = 65$.")
    assert division_solution(455, 7, remainder_kept=False).endswith(r"Ones: $5 \div 7 = 0$. So $455 \div 7 = 60$.")
    working = DivisionWorking(r"Compute $455 \div 7$.")
    assert working.can_slip and (working.answer(True), working.answer(False)) == ("65", "60")
    assert working.solution(False).endswith(r"So the answer is $\boxed{60}$.")
    assert not DivisionWorking(r"Compute $350 \div 7$.").can_slip  # 35 / 7 leaves no remainder


def test_the_verifier_multiplies_back_and_its_slip_drops_the_carry() -> None:
    # 65 x 7: 5 x 7 = 35, write 5 carry 3; 6 x 7 + 3 = 45: 455. Without the carry: 425.
    assert (product_of(65, 7), product_of(65, 7, carry_kept=False)) == (455, 425)
    assert product_check(65, 7, 455) == (r"Check: $5 \times 7 = 35$, write 5 carry 3; $6 \times 7 + 3 = 45$. "
                                         r"The product is $455$, the dividend $455$.")
    working = DivisionWorking(r"Compute $455 \div 7$.")
    assert working.agrees("65", kept=True) and not working.agrees("65", kept=False)
    critique, checked = working.check("65", kept=True)
    assert checked == "65" and "Redo" not in critique
    critique, checked = working.check("65", kept=False, redo_kept=True)  # a false reject, redone right
    assert checked == "65" and critique.endswith("The quotient is $65$.")
    critique, checked = working.check("60", kept=True, redo_kept=False)  # 60 x 7 = 420, redone with the slip
    assert checked == "60" and "The product is $420$" in critique
    assert working.check_can_slip("65") and not working.check_can_slip("61")  # 1 x 7 does not carry


def test_scripted_division_debates_verdicts_follow_the_check_and_hints_localise_the_slip() -> None:
    generator = ProblemGenerator(families=["exact_division"])
    debates = synthetic_debates(300, 0, family="exact_division", answer_accuracy=0.3, wrong_answers="carry",
                                seed_base=10**8, hint_fraction=0.3, hint_roles=["solver"], hint_style="localised",
                                restate_hints=True, verifier="worked", judge="verdict", verifier_accuracy=0.3)
    seen = {"slip": 0, "kept": 0, "false reject": 0, "hinted": 0}
    for i, debate in enumerate(debates):
        problem = generator.by_seed(10**8 + i)
        dividend, divisor = map(int, re.findall(r"\d+", problem.problem))
        right = dividend // divisor
        working = DivisionWorking(problem.problem)
        solution, review, final = (m["tool_calls"][0]["function"]["arguments"] for m in debate if m.get("tool_calls"))
        answer = int(re.search(r"\\boxed\{(\d+)\}", solution["solution"]).group(1))
        assert answer in (right, int(working.answer(False))) and (answer == right or working.can_slip)
        hints = [m for m in debate if m.get("hint")]
        if hints:
            seen["hinted"] += 1
            assert answer == right and hints[0]["content"].startswith(
                localised_hint(problem, "solver", "wrong_answer", working.answer(False)))
        product = int(re.search(r"The product is \$(\d+)\$", review["critique"]).group(1))
        assert product in (answer * divisor, product_of(answer, divisor, carry_kept=False))
        assert list(review) == ["critique", "verdict"]
        assert review["verdict"] == ("CORRECT" if product == dividend else "INCORRECT")
        assert answer == right or review["verdict"] == "INCORRECT"  # a wrong quotient is never accepted
        if review["verdict"] == "CORRECT":
            assert final["answer"] == str(answer)
        else:
            redo = re.search(r"The quotient is \$(\d+)\$\.$", review["critique"]).group(1)
            assert final["answer"] == redo
        seen["slip" if answer != right else "kept"] += 1
        seen["false reject"] += answer == right and review["verdict"] == "INCORRECT"
    assert all(seen.values()), seen


def test_the_worked_turns_are_refused_for_a_family_without_them() -> None:
    with pytest.raises(ValueError, match="defined for family in"):
        synthetic_debates(2, 0, family="single_digit_sum", wrong_answers="carry")


def test_the_division_table_and_its_drills() -> None:
    from trainer_client.tiny_models.build import _train_tokenizer, drill_tokens

    facts = division_facts()
    # tens: parts d..10d-1 for d in 2..9 (9d each: 9 * 44 = 396); ones: b*d for b in 0..9 (80)
    assert len(facts) == 476 and len(set(facts)) == 476
    assert ("Tens", 45, 7, 6, 3) in facts and ("Ones", 35, 7, 5, 0) in facts and ("Tens", 6, 7, 0, 6) not in facts
    every_step = {(part, d) for dividend, d in ((q * d, d) for d in range(2, 10) for q in range(10, 100))
                  for part, _, _ in long_division_steps(dividend, d)}
    assert every_step == {(part, d) for _, part, d, _, _ in facts}  # the table is exactly what a working reads
    (text, spans), = division_fact_drills(1, 0, facts_per_drill=3)
    assert re.fullmatch(r"((Tens: \$\d+ \\\\div \d = \d\$ remainder \$\d\$|Ones: \$\d+ \\\\div \d = \d\$)\. ?){3}", text)
    answers = [g for pair in re.findall(r"= (\d)\$|remainder \$(\d)\$", text) for g in pair if g]
    assert [text[a:b] for a, b in spans] == answers and len(answers) >= 3
    for match in re.finditer(r"Tens: \$(\d+) \\\\div (\d) = (\d)\$ remainder \$(\d)\$", text):
        part, d, digit, remainder = map(int, match.groups())
        assert (digit, remainder) == divmod(part, d)
    # whole digit tokens under the mask (a phrase-token tokenizer keeps each digit a token)
    tokenizer = _train_tokenizer([text] * 3, 300, "", phrase_tokens=True)
    ids, mask = drill_tokens(tokenizer, text, spans)
    assert [tokenizer.decode([i]) for i, m in zip(ids, mask, strict=True) if m] == [text[a:b] for a, b in spans]


def test_the_two_round_recipe_warms_up_on_revisions_after_rejections_only() -> None:
    """``tiny-div-r2``'s spec reaches the warm-up's debates (``max_rounds`` 2): a debate whose
    first answer the scripted verifier rejected holds the solver's revision and a second
    verdict, one it accepted goes straight to the judge; ``tiny-div``'s debates never revise."""
    from trainer_client.tiny_models.build import _warm_up_conversations
    from trainer_client.tiny_models.recipes import TinyModelSpec, tiny_model_spec

    def calls(conversation: list[dict]) -> list[str]:
        return [m["tool_calls"][0]["function"]["name"] for m in conversation
                if m.get("role") == "assistant" and m.get("tool_calls")]

    for name, revises in (("tiny-div-r2", True), ("tiny-div", False)):
        spec = TinyModelSpec(tiny_model_spec(name), debates=60, single_episodes=2)
        debates, singles = _warm_up_conversations(spec)
        assert all(calls(s) == ["submit_solution"] for s in singles)
        seen_revision = False
        for debate in debates:
            names = calls(debate)
            first_verdict = next(m for m in debate if m.get("tool_calls") and
                                 m["tool_calls"][0]["function"]["name"] == "submit_verdict")
            rejected = first_verdict["tool_calls"][0]["function"]["arguments"]["verdict"] == "INCORRECT"
            if revises and rejected:
                assert names == ["submit_solution", "submit_verdict"] * 2 + ["submit_final_answer"], names
                seen_revision = True
            else:
                assert names == ["submit_solution", "submit_verdict", "submit_final_answer"], names
        assert seen_revision is revises
