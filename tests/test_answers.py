"""Reading turns: last boxed answer, verdicts, normal forms (pure string code)."""

from __future__ import annotations

import time

import pytest

from env_server.answers import last_boxed, normalize_answer, parse_verdict


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
