"""math-verify 0.9.0's own test suite, played through our grader as the server plays a turn.

``mathverify_cases.jsonl`` holds every answer pair of math-verify 0.9.0's tests with the verdict
the test expects, math-verify's own verdict and the answer text it extracted from each side
(source, licence and how it was built: ``mathverify_cases.md``), and issue 46's own pairs. Each
case is played the way the server grades a solver turn:

- the gold is what a problem file's ``answer`` would hold (:func:`server_gold`);
- the solver message is the prediction itself when it has a box command (read by
  ``answers.final_answer``: the last box, adjacent boxes merged, a brace-less last box); a
  prediction without one would get no reward (boxed answers only,
  :func:`test_unboxed_predictions_get_no_reward`), so it is played with its answer boxed, as the
  prompt asks, and the case tests grading rather than reading prose (:func:`solver_message`);
- ``Grader.grade(gold, answer)`` (rules, event-loop fast paths, cache, math-verify in worker
  processes), gold first, with the server's default settings but longer timeouts (:data:`GRADING`).

Our verdict must be the expected one, or math-verify's where the two differ, except for the
cases in :data:`DIFFERENCES`, each with our verdict and a one-line argument. The list is exact:
a case that starts to agree must leave it. ``test_braceless_box_and_chain_gold_over_a_real_server``
plays issue 46's forms through a real server's public protocol.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from env_server.cli import running_server
from env_server.client import MuxClient
from env_server.debate.answers import final_answer
from env_server.grading.pool import Grader, GradingConfig
from env_server.grading.worker import _parse_uncached, grade_answer
from env_server.protocol.grades import Grade
from env_server.protocol.markers import EpisodeMode, ErrorKind

CASES_PATH = Path(__file__).with_name("mathverify_cases.jsonl")
CASES: list[dict[str, Any]] = [json.loads(line) for line in CASES_PATH.read_text().splitlines() if line.strip()]

_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)")
_DOLLAR = re.compile(r"(?<!\\)\$")


def _math_content(text: str) -> str | None:
    """The content of ``text`` when it is one math span (``$...$``, ``$$...$$``, ``\\(...\\)``,
    ``\\[...\\]``, surrounding whitespace allowed), else None."""
    text = text.strip()
    for opening, closing in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(text) >= len(opening) + len(closing) and text.startswith(opening) and text.endswith(closing):
            inner = text[len(opening) : -len(closing)]
            if _DOLLAR.search(inner) if opening[0] == "$" else closing in inner:
                continue  # more than one span
            return inner.strip()
    return None


def server_gold(case: dict[str, Any]) -> str:
    """The gold a problem file would hold for the case: a gold written as a solution gives its
    final answer (``answers.final_answer``, as MATH-500's ``answer`` is its solution's box); a
    gold that is one math span, its content; otherwise the answer math-verify extracted from
    it (``gold_answer``), else its text."""
    gold = case["gold"]
    answer = final_answer(gold) if _BOX_COMMAND.search(gold) else None
    if answer is None:
        answer = _math_content(gold)
    if answer is None:
        answer = case["gold_answer"] if case["gold_answer"] is not None else gold.strip()
    return answer


def solver_message(case: dict[str, Any]) -> str:
    """The solver message the case plays: the prediction itself when it has a box command;
    else its answer (the content of a prediction that is one math span, else the answer
    math-verify extracted from it, ``pred_answer``) boxed, as the solver prompt asks, so that
    the case tests grading rather than reading unboxed prose, which the server does not do
    (:func:`test_unboxed_predictions_get_no_reward`); else (math-verify found no answer
    either) the prediction itself."""
    pred = case["pred"]
    if _BOX_COMMAND.search(pred):
        return pred
    answer = _math_content(pred)
    if answer is None:
        answer = case["pred_answer"]
    return pred if answer is None else f"The answer is $\\boxed{{{answer}}}$."


#: the server's default grading settings, except timeouts long enough that a busy machine cannot
#: turn a slow grade (the slowest case takes about 1.5 s on a loaded 2-core machine) into a
#: ``grading_timeout``: the test is about verdicts
GRADING = GradingConfig(workers=2, hard_timeout_s=60, soft_timeout_s=30)
SOFT_TIMEOUT_S = GRADING.soft_timeout_s


async def _grade_all(pairs: list[tuple[str, str | None]]) -> list[bool]:
    grader = Grader(GRADING)
    await grader.start()
    try:
        grades = await asyncio.gather(*(grader.grade(gold, answer) for gold, answer in pairs))
    finally:
        grader.close()
    return [grade.correct for grade in grades]


def our_verdicts(cases: list[dict[str, Any]]) -> dict[str, bool]:
    """``case id -> our verdict``, all cases graded concurrently by one real grader."""
    pairs = [(server_gold(case), final_answer(solver_message(case))) for case in cases]
    return dict(zip((case["id"] for case in cases), asyncio.run(_grade_all(pairs)), strict=True))


_PRECISION = ("a math-verify option the server does not take: its test passes float_rounding={}; the server grades "
              "decimals at 6 significant figures (GradingConfig.sig_figs), where {} is not {}")
_OPTION = "a math-verify option the server does not take ({}); with the default the suite expects our verdict ({})"

#: case id -> (our verdict, why it differs from the expected verdict or from math-verify's)
DIFFERENCES: dict[str, tuple[bool, str]] = {
    # options of math-verify's verify() that its test sets and the server does not: policies, docs/grading.md
    "test_all.py::test_complex_math_expressions[7]": (False, _PRECISION.format(2, "0.33", r"\frac13")),
    "test_all.py::test_complex_math_expressions[13]": (False, _PRECISION.format(2, "2.6667", r"\frac83")),
    "test_all.py::test_precision[0]": (False, _PRECISION.format(4, "0.3333", r"\frac13")),
    "test_all.py::test_set_rel_assymetry[2]": (False, _OPTION.format("allow_set_relation_comp=True",
                                                                     "test_set_rel_assymetry[3]")),
    "test_strict.py::test_strict_variable_comparison[1]": (False, _OPTION.format("strict=False",
                                                                                 "test_strict_variable_comparison[0]")),
    # boxed answers only (policy, docs/grading.md): the last box is the answer
    "test_all.py::test_math_extraction_additional_cases[17]": (
        False, "the last box is 255 (an intermediate result); the unboxed 'The final answer is $10,455$' after it "
               "is not read: the solver prompt asks for the answer boxed and the server reads boxes only"),
    # a gold no problem file would hold
    "test_numina_cases.py::test_numina_cases[24]": (
        False, r"malformed gold ('\\boxed{' with doubled backslashes, never closed): math-verify matches by "
               "reading both sides as -1, the value after their last '=', which would accept 'W(x)=-1' alone too"),
    # ours right, math-verify wrong
    "test_yujianll.py::test_string_extraction[9]": (
        False, r"1 - 1/e is not 1 + 1/e: math-verify's extraction of the $...$ span stops inside "
               r"'\frac{1}{\mathrm{e}}' and reads both sides as 1 (boxed, it tells them apart too)"),
    "issue-46[2]": (True, r"2.3 \times 10^{2} is 230; math-verify 0.9.0 grades it wrong (issue 46)"),
}


@pytest.fixture(scope="module")
def verdicts() -> dict[str, bool]:
    return our_verdicts(CASES)


def test_case_file_is_math_verify_suite() -> None:
    ids = [case["id"] for case in CASES]
    assert len(ids) == len(set(ids)) == 279
    assert sum(case["file"] != "issue-46" for case in CASES) == 276
    # math-verify passes its own suite: the expected and its recorded verdicts agree there
    assert all(case["math_verify"] == case["expected"] for case in CASES if case["file"] != "issue-46")


def test_parity_with_math_verify_suite(verdicts) -> None:
    """Our verdict is the expected one and math-verify's, except for the listed differences."""
    differing = {case["id"]: verdicts[case["id"]] for case in CASES
                 if verdicts[case["id"]] != case["expected"] or verdicts[case["id"]] != case["math_verify"]}
    listed = {case_id: verdict for case_id, (verdict, _) in DIFFERENCES.items()}
    report = [(case["id"], server_gold(case)[:60], (final_answer(solver_message(case)) or "<no box>")[:60],
               case["expected"], case["math_verify"], verdicts[case["id"]])
              for case in CASES if case["id"] in differing.keys() ^ listed.keys()]
    assert differing == listed, report


def test_unboxed_predictions_get_no_reward() -> None:
    """Boxed answers only: a prediction without a box command, played as it is, has no final
    answer and is graded ``missing_final_answer`` (reward 0), whatever math-verify reads in it;
    the parity test plays those cases with their answer boxed."""
    grader = Grader(GradingConfig(workers=1))  # quick_grade only: no worker is started
    unboxed = [case for case in CASES if not _BOX_COMMAND.search(case["pred"])]
    assert len(unboxed) > 150
    for case in unboxed:
        assert final_answer(case["pred"]) is None, case["id"]
        assert grader.quick_grade(server_gold(case), None) == Grade(False, ErrorKind.MISSING_FINAL_ANSWER, "rule")


def test_two_stage_parsing_gives_the_ll_parse_on_the_suite() -> None:
    """The worker's SLL-then-LL parsing returns what LL alone returns on every gold and answer
    of the suite (``1 = \\zzz = x = 0``, whose unknown command is a lexer error, among them)."""
    from antlr4.atn.PredictionMode import PredictionMode
    from latex2sympy2_extended import latex2sympy2 as l2s

    texts = sorted({server_gold(case) for case in CASES}
                   | {answer for case in CASES if (answer := final_answer(solver_message(case))) is not None})
    assert r"1 = \zzz = x = 0" in texts

    def parse_all() -> list[str]:
        out = []
        for text in texts:
            try:
                out.append(str(_parse_uncached(text, SOFT_TIMEOUT_S)))
            except Exception as exc:
                out.append(f"error {type(exc).__name__}")
        return out

    two_stage = l2s.PSParser
    with_two_stage = parse_all()

    class LLOnly(two_stage.__mro__[1]):  # the original PSParser
        def math(self):
            self._interp.predictionMode = PredictionMode.LL
            return super().math()

    l2s.PSParser = LLOnly
    try:
        assert parse_all() == with_two_stage
    finally:
        l2s.PSParser = two_stage


#: issue 46's forms on a real server: (problem id, gold, solver message, reward)
SERVED = [
    ("issue46/box4", "4", r"The answer is \boxed 4", 1.0),
    ("issue46/box7", "7", r"So we get $\boxed 7$ as the answer.", 1.0),
    ("issue46/chain", r"1 = \zzz = x = 0", r"So $x = \boxed{0}$.", 1.0),
    ("issue46/box4", "4", r"The answer is \boxed 5", 0.0),  # the brace-less box is read, not rewarded blindly
]


def test_braceless_box_and_chain_gold_over_a_real_server(tmp_path) -> None:
    """Issue 46 end to end: a real server (subprocess, real socket) serving golds ``4``, ``7`` and
    ``1 = \\zzz = x = 0``; single-mode episodes over ``/ws/mux`` whose solver message ends in the
    answer; the delayed-reward record gives reward 1 to ``\\boxed 4``, ``$\\boxed 7$`` and a boxed
    ``0``, and 0 to ``\\boxed 5`` for gold 4."""
    problems = tmp_path / "issue46.jsonl"
    golds = {problem_id: gold for problem_id, gold, _, _ in SERVED}
    problems.write_text("".join(json.dumps({"problem": f"Problem {problem_id}", "answer": gold, "unique_id": problem_id})
                                + "\n" for problem_id, gold in golds.items()))

    async def main(url: str) -> list[tuple[float, str | None, ErrorKind | None]]:
        async with MuxClient(url) as client:
            async def play(problem_id: str, message: str) -> tuple[float, str | None, ErrorKind | None]:
                session = await client.open_session()
                await session.reset(problem_id=problem_id, mode=EpisodeMode.SINGLE)
                await session.step("solver", message)
                record = await session.rewards(timeout_s=60)
                assert record is not None
                return record.episode_reward, record.turns[0].answer, record.turns[0].error_kind

            return await asyncio.gather(*(play(problem_id, message) for problem_id, _, message, _ in SERVED))

    with running_server(["--problems", str(problems), "--grading-workers", "1"]) as url:
        results = asyncio.run(main(url))
    assert results == [(1.0, "4", None), (1.0, "7", None), (1.0, "0", None), (0.0, "5", ErrorKind.WRONG_ANSWER)]
    assert [reward for reward, _, _ in results] == [reward for _, _, _, reward in SERVED]


#: the examples of docs/grading.md: (gold, answer, our verdict, math-verify 0.9.0's verdict called as
#: ``verify(parse("\\boxed{gold}"), parse("\\boxed{answer}"))``)
ANSWER_POLICIES = [
    # a value is compared by value at 60 digits; a decimal at 6 significant figures (relative), not
    # math-verify's 6 decimal places (absolute)
    (r"\frac{1}{2^{60}}", r"\frac{1}{2^{61}}", False, True),
    (r"\frac{1}{3000000}", "0.0000003", False, True),
    (r"\pi", "3.14159", True, False),
    ("230", r"2.3 \times 10^{2}", True, False),
    (r"\frac13", "0.333333", True, True),
    (r"\frac13", "0.33", False, False),
    (r"\sqrt{8}", r"2\sqrt{2}", True, True),
    (r"2e", r"2\mathrm{e}", True, False),  # \mathrm{e} is Euler's number
    # as math-verify
    (r"28\%", "28", True, True), (r"28\%", "0.28", True, True), ("28", r"28\%", True, True), ("28", "0.28", False, False),
    ("42", r"42\text{ cm}^2", True, True), ("18", r"\$18", True, True),
    (r"90^\circ", "90", True, True), (r"90^\circ", r"\frac{\pi}{2}", False, False),
    (r"\frac12", r"\frac{2}{4}", True, True),
    ("(1,2)", "(2,1)", False, False), (r"\{1,2\}", r"\{2,1\}", True, True), ("-2, 3", "3, -2", True, True),
    (r"\text{Monday}", r"\text{monday}", True, True), (r"\text{(C)}", "C", True, True),
    ("5", "x=5", True, True), (r"1 = \zzz = x = 0", "0", True, True),
    ("f(x)", "f(y)", False, False),
    (r"-2 \le x \le 7", r"x \in [-2,7]", True, True), (r"x \in [-2,7]", r"-2 \le x \le 7", False, False),
]
#: the same for whole solver messages (math-verify: ``verify(parse("\\boxed{gold}"), parse(message))``)
MESSAGE_POLICIES = [
    ("3", "The answer is $3$.", False, True),  # boxed answers only
    ("10455", r"$\boxed{255}$ So the final answer is $10,455$.", False, True),  # the last box is the answer
    ("7", r"So we get $\boxed 7$ as the answer.", True, True),  # a brace-less box
    ("4", r"First \boxed{3} and then \boxed 4", True, False),  # the last box command, braced or not
    ("1, -2", r"so $n = \boxed{-2}$ or $n = \boxed{1}$.", True, True),  # adjacent boxes: one answer
    ("2", r"So $\tan A = \boxed{3}$ or $\boxed{2}$.", False, False),  # a hedge is wrong
]


def _math_verify(gold: str, prediction: str) -> bool:
    from math_verify import parse, verify

    return bool(verify(parse(f"\\boxed{{{gold}}}"), parse(prediction)))


@pytest.mark.parametrize(("gold", "answer", "ours", "theirs"), ANSWER_POLICIES)
def test_answer_policies_of_the_grading_docs(gold: str, answer: str, ours: bool, theirs: bool) -> None:
    assert grade_answer(gold, answer, timeout_s=SOFT_TIMEOUT_S) == (ours, None)
    quick = Grader(GradingConfig(workers=1)).quick_grade(gold, answer)  # the event-loop paths agree when they decide
    assert quick is None or quick.correct is ours
    assert _math_verify(gold, f"\\boxed{{{answer}}}") is theirs


@pytest.mark.parametrize(("gold", "message", "ours", "theirs"), MESSAGE_POLICIES)
def test_message_policies_of_the_grading_docs(gold: str, message: str, ours: bool, theirs: bool) -> None:
    answer = final_answer(message)
    assert (answer is not None and grade_answer(gold, answer, timeout_s=SOFT_TIMEOUT_S) == (True, None)) is ours
    assert _math_verify(gold, message) is theirs
