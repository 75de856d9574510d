"""The grading policies a user will ask about, pinned (env_server/grading/worker.py).

These call the worker function directly, in this process's main thread (math-verify's
timeouts need it); tests/env_server/grading/test_pool.py covers the process pool.
"""

from __future__ import annotations

import json
import random
from fractions import Fraction

import pytest

from env_server.debate.answers import final_answer, normalize_answer
from env_server.debate.closed_form import exact_rational
from env_server.grading.pool import Grader, GradingConfig
from env_server.grading.worker import grade_answer

POLICIES = [
    # (gold, answer, correct) -- relative tolerance, not absolute rounding
    (r"\frac{1}{2^{60}}", r"\frac{1}{2^{61}}", False),
    (r"\frac{1}{2^{60}}", r"2^{-60}", True),
    (r"1-\frac{1}{\mathrm e}", r"1+\frac1{\mathrm e}", False),
    (r"1-\frac{1}{e}", r"1-e^{-1}", True),
    # decimals for exact answers: 6 significant figures
    (r"\pi", "3.14159", True),
    (r"\pi", "3.14", False),
    (r"\frac{\sqrt3}{2}", "0.866025", True),
    (r"\frac13", "0.333333", True),
    (r"\frac13", "0.33", False),
    ("0", "0.0", True),
    ("0", "0.0000001", False),
    ("2", "2.0", True),
    # percent: interchangeable with its number, both ways
    (r"28\%", "28", True),
    (r"28\%", "0.28", True),
    ("28", r"28\%", True),
    ("28", "0.28", False),
    # units stripped; degrees dropped without conversion
    ("42", r"42\text{ cm}^2", True),
    (r"90^\circ", "90", True),
    (r"90^\circ", r"\frac{\pi}{2}", False),
    (r"18", r"\$18", True),
    # unreduced fractions accepted
    (r"\frac12", r"\frac{2}{4}", True),
    (r"\frac12", "0.5", True),
    # tuples ordered, sets not; a bare list is a set
    ("(1,2)", "(2,1)", False),
    (r"\left( 3, \frac{\pi}{2} \right)", r"(3,\frac{\pi}{2})", True),
    (r"\{1,2\}", r"\{2,1\}", True),
    ("-2, 3", "3, -2", True),
    # text answers: case-insensitive
    (r"\text{Monday}", r"\text{monday}", True),
    (r"\text{(C)}", "C", True),
    # equations and expressions
    ("5", "x=5", True),
    ("x^2+1", "1+x^2", True),
    (r"\sqrt{8}", r"2\sqrt{2}", True),
    ("1000", "1,000", True),
    (r"(-\infty,3]", r"(-\infty,3)", False),
]


@pytest.mark.parametrize(("gold", "answer", "correct"), POLICIES)
def test_policy(gold: str, answer: str, correct: bool) -> None:
    assert grade_answer(gold, answer) == (correct, None)


def test_unparseable_answer_is_marked() -> None:
    assert grade_answer("3", "}{") == (False, "unparseable_answer")


@pytest.mark.parametrize("tower", [r"9^{9^{9^9}}", r"(10^{10})!", r"10^{10^{10^{10}}}"])
def test_exponent_towers_hit_the_soft_timeout(tower: str) -> None:
    assert grade_answer("2", tower, timeout_s=1) == (False, "grading_timeout")


INJECTIONS = [
    "__import__('os').system('touch {path}')",
    "__import__(\"os\").system(\"touch {path}\")",
    "().__class__.__bases__[0].__subclasses__()",
    "(lambda: __import__('os').system('touch {path}'))()",
    r"\text{__import__('os').system('touch {path}')}",
    "exec(\"open('{path}','w')\")",
    r"eval('open(\'{path}\',\'w\')')",
]


@pytest.mark.parametrize("payload", INJECTIONS)
def test_injection_payloads_never_execute(payload: str, tmp_path) -> None:
    target = tmp_path / "pwned"
    answer = payload.replace("{path}", str(target))
    for gold in ("1", r"\frac{1}{2}", "x+1"):
        correct, _ = grade_answer(gold, answer, timeout_s=1)
        assert correct is False
    assert not target.exists()


def _math500(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_math500_reference_solutions_are_all_correct(math500_path) -> None:
    rows = _math500(math500_path)
    assert len(rows) == 500
    # read as the server reads a turn: test/number_theory/459's "$\\boxed{15\\frac{39}{40}},$ or
    # $\\boxed{\\frac{639}{40}}$" is one answer of two boxes (equal values)
    wrong = [r["unique_id"] for r in rows if grade_answer(r["answer"], final_answer(r["solution"]) or "") != (True, None)]
    assert wrong == []


def test_math500_mismatched_pairs_are_all_incorrect(math500_path) -> None:
    rows = _math500(math500_path)
    rng = random.Random(0)
    pairs = []
    while len(pairs) < 500:
        gold_row, other = rng.choice(rows), rng.choice(rows)
        answer = final_answer(other["solution"]) or ""
        # a mismatched pair: different answers, not mere respellings of one value (e.g. 5 vs x=5)
        if normalize_answer(gold_row["answer"]).removeprefix("x=") == normalize_answer(other["answer"]).removeprefix("x="):
            continue
        pairs.append((gold_row["answer"], answer))
    matched = [(g, a) for g, a in pairs if grade_answer(g, a)[0]]
    assert matched == []


#: MATH-500 problems whose answer is a list (or a ± pair), answered in several boxes:
#: (unique_id, response, correct). Boxes merged by math-verify's rule (answers.final_answer) are
#: the collection of their answers, in any order; a missing or extra element, or a hedge between
#: answers, is wrong; a box far from the final one is an intermediate result, not part of it.
MULTI_BOX = [
    ("test/intermediate_algebra/1388.json", r"so $n = \boxed{-2}$ or $n = \boxed{1}$.", True),  # gold 1,-2
    ("test/intermediate_algebra/428.json", r"The roots are $\boxed{7}$, $\boxed{3}$ and $\boxed{5}$.", True),
    ("test/intermediate_algebra/1102.json", r"\boxed{1}, \boxed{-2}", True),  # gold -2,1
    ("test/intermediate_algebra/662.json", r"$x = \boxed{1 + \sqrt{19}}$ and $x = \boxed{1 - \sqrt{19}}$", True),
    ("test/precalculus/768.json", r"\boxed{3 - 2\sqrt{2}}, \boxed{3 + 2\sqrt{2}}", True),  # gold 3 \pm 2 \sqrt{2}
    ("test/intermediate_algebra/2015.json", r"\boxed{-2}, \boxed{1+\sqrt{5}}, \boxed{1-\sqrt{5}}", True),
    ("test/intermediate_algebra/1102.json", r"\boxed{1}", False),  # a root missing
    ("test/intermediate_algebra/428.json", r"\boxed{3}, \boxed{5}", False),
    ("test/intermediate_algebra/1102.json", r"\boxed{1}, \boxed{-2}, \boxed{2}", False),  # one too many
    ("test/intermediate_algebra/1388.json", r"\boxed{1} or \boxed{2}", False),
    ("test/geometry/178.json", r"So $\tan A = \boxed{3}$ or $\boxed{2}$.", False),  # gold 2: a hedge is wrong
    ("test/geometry/178.json", r"\boxed{2} and \boxed{2}", True),  # the same box twice is one answer
    ("test/geometry/178.json", r"First $BC = \boxed{4}$ as found above. Therefore $\tan A = \boxed{2}$.", True),
]


@pytest.mark.parametrize(("unique_id", "response", "correct"), MULTI_BOX)
def test_multi_box_answers_on_math500_lists(math500_path, unique_id: str, response: str, correct: bool) -> None:
    gold = next(r["answer"] for r in _math500(math500_path) if r["unique_id"] == unique_id)
    answer = final_answer(response)
    assert answer is not None
    assert grade_answer(gold, answer)[0] is correct
    quick = Grader(GradingConfig(workers=1)).quick_grade(gold, answer)  # the event-loop paths agree when they decide
    assert quick is None or quick.correct is correct


@pytest.mark.parametrize("text, value", [
    ("42", Fraction(42)), ("-7", Fraction(-7)), (r"\frac{2}{4}", Fraction(1, 2)), (r"-\dfrac{3}{9}", Fraction(-1, 3)),
    (r"\frac{-3}{4}", Fraction(-3, 4)), (r" \tfrac{10} {5} ", Fraction(2)),
    ("0.5", None), (r"28\%", None), ("1,000", None), (r"\frac{1}{0}", None), (r"2\sqrt{2}", None), ("x", None),
    ("1" * 61, None),
])
def test_exact_rational_reads_only_plain_integers_and_fractions(text: str, value) -> None:
    assert exact_rational(text) == value


def test_numeric_fast_path_agrees_with_math_verify_on_math500(math500_path) -> None:
    """Every MATH-500 pair the grader decides without a worker (both answers plain integers or
    integer fractions) gets math-verify's verdict: matching and mismatched pairs."""
    answers = [json.loads(line)["answer"] for line in math500_path.read_text().splitlines() if line.strip()]
    rational = [a for a in answers if exact_rational(a) is not None]
    assert len(rational) > 150  # most MATH-500 answers are numbers: the fast path matters
    rng = random.Random(0)
    pairs = [(gold, rng.choice(rational)) for gold in rational[:120]]
    pairs += [(gold, rf"\frac{{{2 * int(exact_rational(gold).numerator)}}}{{{2 * exact_rational(gold).denominator}}}")
              for gold in rational[:40]]
    for gold, answer in pairs:
        fast = exact_rational(gold) == exact_rational(answer)
        assert grade_answer(gold, answer)[0] == fast, (gold, answer)
