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
from env_server.debate.closed_form import _DEGREES, _container, _value, closed_form_verdict
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
