"""The grader's event-loop fast paths and worker speed-ups give the worker's verdicts.

``closed_form.closed_form_verdict`` decides some pairs without sympy; every verdict it gives must
be the one ``grading_worker.grade_answer`` (math-verify + our policies) gives. The worker's
two-stage parsing must give the same parses as latex2sympy's plain LL parsing.
"""

from __future__ import annotations

import json
import random

import pytest
import sympy

from env_server.debate.answers import last_boxed, normalize_answer
from env_server.debate.closed_form import _DEGREES, _container, _value, closed_form_verdict, undecorated
from env_server.grading.worker import _parse_uncached, grade_answer


@pytest.mark.parametrize(("gold", "answer", "verdict"), [
    ("2", "2.0", True), (r"\frac12", "0.5", True), (r"\frac 34", r"\dfrac{3}{4}", True), (r"\frac9{12}", "0.75", True),
    (r"\pi", "3.14", False), (r"\frac13", "0.33", False), ("0", "0.0000001", False),
    (r"\frac{1}{2^{60}}", r"\frac{1}{2^{61}}", False), ("10", r"\frac{\sqrt{3}}{3}", False), (r"2\sqrt5", "6", False),
    (r"90^\circ", r"\frac{\pi}{2}", False), ("28", r"36^\circ", False),
    ("2", "(15,-29)", False), ("7", r"(2,12) \cup (12,102)", False), ("2", "-2,1", False), ("5", r"(5,\infty)", False),
    (r"\left( 3, \frac{\pi}{2} \right)", "64", False), (r"\{1, 2\}", "3", False),
    # undecided: left to the worker
    (r"\pi", "3.14159", None), (r"\frac13", "0.333333", None), (r"\sqrt8", r"2\sqrt2", None), ("2", "2,2", None),
    ("12", "1,234", None), ("5", "5m", None), ("1", r"\frac{1}{2}3", None), (r"1\frac{4}{5}", "1.8", None),
    ("4", r"x\in[1,2]", None),
    (r"28\%", "0.28", None), ("1000", "1 000", None), ("2", r"\sqrt{-4}", None), ("2", "2k", None),
])
def test_closed_form_verdicts(gold: str, answer: str, verdict: bool | None) -> None:
    assert closed_form_verdict(gold, answer, 6) is verdict
    if verdict is not None:
        assert grade_answer(gold, answer) == (verdict, None)


def _math500_answers(path) -> list[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted({r["answer"] for r in rows} | {last_boxed(r["solution"]) or "" for r in rows})


def test_closed_form_values_match_math_verify_parses(math500_path) -> None:
    """Every MATH-500 answer the reader accepts parses, in the worker, to a number inside
    the reader's interval (decimals within float precision: latex2sympy may read them as
    binary floats, which both significant-figure and exact rules then treat alike); every
    container it accepts parses to a tuple, set or interval."""
    checked = 0
    for text in _math500_answers(math500_path):
        normal = _DEGREES.sub("", normalize_answer(text))
        value = _value(normal)
        if value is None and not _container(normal):
            continue
        parsed = _parse_uncached(text, 3)[0]
        if value is not None:
            number = sympy.N(parsed, 40)
            slack = sympy.Rational(1, 10**12) * (1 + abs(value[1]))
            assert number.is_real and value[0] - slack <= number <= value[1] + slack, text
        else:
            assert (isinstance(parsed, (sympy.Tuple, sympy.Set)) and parsed != sympy.EmptySet) or parsed.is_empty, text
        checked += 1
    assert checked > 200


def test_closed_form_verdicts_agree_with_the_worker_on_math500(math500_path) -> None:
    """Every MATH-500 pair the fast path decides gets the worker's verdict (and no error kind):
    all gold/other-answer pairs among a random sample, both orders."""
    answers = _math500_answers(math500_path)
    rng = random.Random(0)
    decided = []
    for _ in range(20_000):
        gold, answer = rng.choice(answers), rng.choice(answers)
        verdict = closed_form_verdict(gold, answer, 6)
        if verdict is not None and normalize_answer(gold) != normalize_answer(answer):
            decided.append((gold, answer, verdict))
    assert len(decided) > 500
    for gold, answer, verdict in decided[:800]:
        assert grade_answer(gold, answer) == (verdict, None), (gold, answer)


def test_two_stage_parsing_gives_the_ll_parse(math500_path) -> None:
    """SLL-then-LL parsing returns exactly what LL alone returns, on every MATH-500 answer."""
    from antlr4.atn.PredictionMode import PredictionMode
    from latex2sympy2_extended import latex2sympy2 as l2s

    two_stage = l2s.PSParser
    texts = _math500_answers(math500_path)

    def parse_all() -> list[str]:
        out = []
        for text in texts:
            try:
                out.append(str(_parse_uncached(text, 3)))
            except Exception as exc:
                out.append(f"error {type(exc).__name__}")
        return out

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


@pytest.mark.parametrize("answer", [
    r"{9^{64}}^{64}", r"{{9^{64}}^{64}}^{64}", r"{{{9^{64}}^{64}}^{64}}^{64}", r"\sqrt{{{9^{64}}^{64}}^{64}}",
    r"\frac{1}{{{9^{64}}^{64}}^{64}}", r"{9^{64}}^{64}-{9^{64}}^{64}",
])
def test_closed_form_refuses_huge_values(answer: str) -> None:
    """Nested powers past 2,048-bit endpoints are not evaluated on the event loop (before the
    bound, ``{{{9^{64}}^{64}}^{64}}^{64}`` held it for minutes); a worker, with its hard kill,
    decides them."""
    assert _value(answer) is None
    assert closed_form_verdict("1", answer, 6) is None


@pytest.mark.parametrize(("answer", "plain"), [
    (r"\$18", "18"), (r"\$ -18.5", "-18.5"), (r"18 \text{ dollars}", "18"),
    (r"-\frac{3}{4} \text{ cups of flour}", r"-\frac{3}{4}"), (r"7\mbox{ eggs}", "7"), (r"x = 18", "18"),
    (r"n=\dfrac{1}{2}", r"\dfrac{1}{2}"), (r"\mathbf{18}", "18"), (r"\textbf{-3}", "-3"),
    # left to the worker: it does not read these as the number inside (unparseable, or another value)
    (r"\mathbf{\frac34}", None), (r"\mathbf{18} \text{ dollars}", None), (r"18 \text{ and}", None), (r"18 \text{ or}", None),
    (r"18 \text{ dollars}.", None), (r"x = y = 18", None), (r"\$18 \text{ dollars}", None), (r"18 \text{ m}^2", None),
    (r"\pi = 3", None), ("18", None), (r"18 \text{ }", None), ("18 dollars", None), ("1" + " a" * 200, None),
])
def test_undecorated_takes_out_the_plain_number_of_one_decoration(answer: str, plain: str | None) -> None:
    assert undecorated(answer) == plain


def test_decorated_verdicts_agree_with_the_worker() -> None:
    """Every pair the grader decides through ``undecorated`` (source ``decorated``) gets the
    worker's verdict and no error kind: integers (negative, zero, large), decimals and fractions,
    each decoration, the same value and other values, units from a word list."""
    from env_server.grading.pool import Grader, GradingConfig

    grader = Grader(GradingConfig(workers=1))  # quick_grade only: no worker is started
    rng = random.Random(0)
    units = ["dollars", "eggs", "minutes", "meters", "cm", "km", "s", "e", "i", "x", "pi", "degrees", "feet",
             "miles per hour", "cups of flour", "salt and pepper", "per", "is", "not", "if", "sq ft", "Total"]
    golds = ["18", "-18", "0", "1000000", r"\frac{3}{4}", r"-\frac{5}{2}", "2.5", "0.125", r"\dfrac{7}{8}", "12"]
    values = ["18", "-18", "0", "19", "1000000", "2.5", "2.50", "0.125", r"\frac{3}{4}", r"\frac{6}{8}", "0.75",
              r"-\frac{5}{2}", "-2.5", r"\frac{7}{8}", "0.875", "12", "12.0", "-12"]
    shapes = [r"\${}", r"\$ {}", "{} \\text{{ {unit}}}", "{}\\text{{{unit}}}", "{} \\mbox{{ {unit}}}", "x = {}", "k={}",
              r"\mathbf{{{}}}", r"\textbf{{{}}}"]
    decided = []
    for _ in range(400):
        gold, value, shape = rng.choice(golds), rng.choice(values), rng.choice(shapes)
        answer = shape.replace("{unit}", rng.choice(units)).format(value) if "{unit}" in shape else shape.format(value)
        grade = grader.quick_grade(gold, answer)
        if grade is not None and grade.source == "decorated":
            decided.append((gold, answer, grade.correct))
    assert len(decided) > 250 and {verdict for _, _, verdict in decided} == {True, False}
    # a gold with its own unit or decoration is left to the worker ("5 m" against "5 cm")
    assert grader.quick_grade(r"5\text{ cm}", r"5 \text{ m}") is None
    assert grader.quick_grade(r"\$18.90", r"\$18.9") is None
    for gold, answer, verdict in decided:
        assert grade_answer(gold, answer) == (verdict, None), (gold, answer)
