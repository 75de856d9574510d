"""A last box written without braces (``\\boxed 7``) is the answer (issue 46), read as math-verify
reads it: to the end of its math span inside one, to the next space outside, alone."""

from __future__ import annotations

import pytest

from env_server.debate.answers import final_answer

BRACELESS = [
    (r"The answer is \boxed 4", "4"),
    (r"So we get $\boxed 7$ as the answer.", "7"),
    (r"The answer is \boxed 42.", "42"),  # sentence punctuation is not part of it
    (r"$\boxed 42$", "42"),  # TeX would box the 4 alone; the model means 42, as math-verify reads it
    (r"$$\boxed 7$$", "7"),
    (r"So $y = \boxed x + 1$ here.", "x + 1"),  # inside a math span: to its end
    (r"\(\boxed 2\sqrt{3}\) done", r"2\sqrt{3}"),
    (r"\[ \boxed -\frac{1}{2} \]", r"-\frac{1}{2}"),
    (r"The answer is \boxed x + 1 as shown", "x"),  # outside math: to the next space
    (r"It costs \$5, so \boxed 7", "7"),  # an escaped dollar opens no math span
    (r"\boxed\pi", r"\pi"),
    (r"\boxed -3", "-3"),
    ("so \\boxed 9\nNext line", "9"),
    (r"\boxed {5}", "5"),  # a brace after spaces is a braced box
    # the last box command decides: a brace-less last box stands alone, a brace-less earlier one
    # is not merged with the braced last one
    (r"First \boxed{3} and then \boxed 4", "4"),
    (r"\boxed 4 and \boxed{3}", "3"),
    (r"\boxed{1}, \boxed 2", "2"),
    # ``\fboxsep`` is another command, not a box
    (r"\fboxsep=3pt \boxed{5}", "5"),
    (r"\boxed{5} \fboxsep", "5"),
    # no answer: nothing after the command, or an unclosed braced box (a response cut mid-answer)
    (r"The answer is \boxed", None),
    (r"The answer is $\boxed$.", None),
    (r"\boxed{7", None),
]


@pytest.mark.parametrize(("text", "answer"), BRACELESS)
def test_braceless_last_box(text: str, answer: str | None) -> None:
    assert final_answer(text) == answer
