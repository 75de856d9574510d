"""Reading turns: last boxed answer, verdicts, normal forms (pure string code)."""

from __future__ import annotations

import time

import pytest

from env_server.debate.answers import (
    MAX_ANSWER_BRACES,
    MAX_TRAILING_BOXES,
    final_answer,
    last_boxed,
    normalize_answer,
    normalize_critique,
    parse_verdict,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{3}", "3"),
        (r"\boxed{1} then \boxed{2}", "2"),  # the last box wins
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # nested braces
        (r"\boxed{\{1,2\}}", r"\{1,2\}"),  # escaped braces do not count
        (r"\boxed{3} and a cut one \boxed{\frac{1", "3"),  # an unclosed last box is skipped
        (r"\fbox{7}", "7"),
        (r"\boxed {x+1}", "x+1"),
        (r"\boxed{}", ""),
        ("no box here", None),
        (r"\boxed{", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


def test_last_boxed_is_linear_on_hostile_input() -> None:
    hostile = r"\boxed{" + "{" * 50_000 + "}" * 49_999  # never closes
    start = time.perf_counter()
    assert last_boxed(hostile) is None
    assert last_boxed(r"\boxed{" * 20_000) is None
    assert time.perf_counter() - start < 5.0  # a hang guard (quadratic scans took minutes), not a speed target


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # adjacent boxes are one answer, their collection (math-verify's rule)
        (r"\boxed{1} and \boxed{2}", "1, 2"),
        (r"so $\boxed{(2,1)}$, $\boxed{(1,2)}$.", "(2,1), (1,2)"),
        (r"\boxed{3} or \boxed{2}", "3, 2"),
        (r"\boxed{1}\boxed{2}", "1, 2"),  # under 10 characters apart: no separator needed
        (r"\boxed{a}; \boxed{b}; \boxed{c}", "a, b, c"),
        (r"\boxed{2} and \boxed{2}", "2"),  # repeated contents count once
        (r"$x = \boxed{3}$ or $x = \boxed{-2}$", "3, -2"),
        # an intermediate result boxed earlier stays out: the last-box rule
        (r"First $\boxed{5}$ apples. Adding the rest gives a total of $\boxed{12}$.", "12"),
        (r"\boxed{5} is the number of red marbles in the first bag, and adding the blue ones gives \boxed{12}", "12"),
        (r"\boxed{5} then \boxed{12}", "5, 12"),  # math-verify's rule: under 10 characters apart, any words
        (r"\boxed{1}" + " " * 70 + r", \boxed{2}", "2"),  # 70 or more characters apart: never merged
        (r"\boxed{1} and \boxed{2", "1"),  # an unclosed last box is skipped, as in last_boxed
        (r"\boxed{3 \fbox{4}}", "4"),  # a box enclosing the last one is not merged
        (r"\boxed{1} and \boxed 2 and \boxed{3}", "3"),  # a box without a brace ends the walk
        (r"\boxed{\{1,2\}}, \boxed{3}", r"\{1,2\}, 3"),
        (r"so \boxed{3}", "3"),
        ("no box here", None),
    ],
)
def test_final_answer(text: str, expected: str | None) -> None:
    assert final_answer(text) == expected


def test_final_answer_follows_math_verifys_box_merging() -> None:
    """Our merge against math-verify's own (``extract_boxed_content``, which its parser applies to a
    bare ``\\boxed{.+}`` match) on random texts of boxes, separators and filler: the same boxes,
    in the same order (math-verify joins with ``","``, we with ``", "``)."""
    import random

    from latex2sympy2_extended.math_normalization import extract_boxed_content

    pieces = [r"\boxed{1}", r"\boxed{2}", r"\boxed{x}", r"\fbox{3}", " and ", " or ", ", ", "; ", " ", ".", "$",
              "xxxxx", "y" * 30, " band ", "\n"]
    rng = random.Random(0)
    checked = 0
    for _ in range(5000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 9)))
        if "\\boxed" not in text and "\\fbox" not in text:
            continue
        answer = final_answer(text)
        assert answer is not None and answer.replace(", ", ",") == extract_boxed_content(text, "last"), text
        checked += 1
    assert checked > 3000


def test_final_answer_is_linear_on_hostile_input() -> None:
    start = time.perf_counter()
    many = "".join(rf"\boxed{{{i}}}, " for i in range(30_000))
    # only the last MAX_TRAILING_BOXES boxes are read (the event loop's bound); the grader's 8 KB cap applies later
    assert final_answer(many) == ", ".join(str(i) for i in range(30_000 - MAX_TRAILING_BOXES, 30_000))
    assert final_answer(r"\boxed{1}," * 50_000) == "1"
    assert final_answer(r"\boxed{" * 20_000 + "}") == ""
    assert final_answer(r"\boxed" * 50_000) is None
    assert time.perf_counter() - start < 5.0  # a hang guard, not a speed target


def test_normalize_critique() -> None:
    assert normalize_critique("  Step 2 is WRONG.\n\nVERDICT:\tINCORRECT ") == "step 2 is wrong. verdict: incorrect"
    assert normalize_critique("Step 2 is wrong.") != normalize_critique("Step 3 is wrong.")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Looks fine.\nVERDICT: CORRECT", "CORRECT"),
        ("VERDICT: INCORRECT because step 2 is wrong", "INCORRECT"),
        ("verdict: **incorrect**", "INCORRECT"),
        ("VERDICT: CORRECT ... on second thought VERDICT: INCORRECT", "INCORRECT"),
        ("I think it is correct.", None),
        ("VERDICT: CORRECTION needed", None),
    ],
)
def test_parse_verdict(text: str, expected: str | None) -> None:
    assert parse_verdict(text) == expected


def test_normalize_answer_only_applies_value_preserving_rewrites() -> None:
    assert normalize_answer(r"\left( 3, \dfrac{\pi}{2} \right)") == normalize_answer(r"(3,\frac{\pi}{2})")
    assert normalize_answer(r"1,\!000") == "1,000"
    assert normalize_answer("$42$.") == "42"
    # a control word keeps its separating space: \pi r must not become the unknown \pir
    assert normalize_answer(r"\pi r^2") == r"\pi r^2"
    assert normalize_answer("(1,2)") != normalize_answer("(2,1)")


def test_event_loop_reading_is_bounded_and_reference_solutions_are_unaffected(math500_path, gsm8k_path) -> None:
    """Past MAX_ANSWER_BRACES braces in the answer region a response has no readable answer
    (the event loop's bound); every MATH-500 and GSM8K reference solution is far inside it and
    reads the same answer as the boxes' plain last-box content."""
    inner = "{" * (MAX_ANSWER_BRACES // 2 - 2) + "1" + "}" * (MAX_ANSWER_BRACES // 2 - 2)
    assert final_answer(rf"\boxed{{{inner}}}") == inner
    assert final_answer(rf"\boxed{{{'{{' + inner + '}}'}}}") is None  # 2 braces over the bound
    assert final_answer("{" * 5000 + r" \boxed{7}") == "7"  # braces before the boxes do not count
    import json

    from env_server.debate.problems.jsonl import gsm8k_solution

    for path, field in ((math500_path, "solution"), (gsm8k_path, "answer")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            solution = record[field] if field == "solution" else gsm8k_solution(record[field])
            if "\\boxed" in solution:
                assert final_answer(solution) is not None, solution[-200:]
