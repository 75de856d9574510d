"""The built-in procedural problem generator: the embedded default, needs no files.

Deterministic: ``by_seed(seed)`` picks family ``FAMILIES[seed % len(FAMILIES)]`` and draws its
parameters from ``random.Random(f"{family}/{seed}")``; ``problem_id = "gen/<family>/<seed>"``,
so ``get(problem_id)`` regenerates the same problem anywhere. Answers are exact (integers,
reduced fractions, sets of roots) and written in LaTeX; each solution ends with the answer in
``\\boxed{}``.

``EXTRA_FAMILIES`` are selectable by name (``ProblemGenerator(families=["single_digit_sum"])``,
``--problems gen:single_digit_sum``) but are not in the default rotation, so the default
generator's problem for every seed is unchanged. ``SPLIT_FAMILIES`` (also extra) draw from the
seed itself, not a seeded RNG: their content is split between RL, warm-up, validation and
held-out seeds (:mod:`env_server.debate.problems.splits`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from fractions import Fraction
from functools import lru_cache
from math import gcd, lcm

from env_server.debate.problems.base import Problem, ProblemSource, UnknownProblemError
from env_server.debate.problems.splits import division_pairs, split_index, split_of_seed, two_digit_pairs

__all__ = ["EXTRA_FAMILIES", "FAMILIES", "SPLIT_FAMILIES", "ProblemGenerator", "latex_number", "polynomial"]

Draw = tuple[str, str, str, int]  # (problem text, answer, solution, level)


def latex_number(value: Fraction | int) -> str:
    """An exact rational in LaTeX: ``7``, ``-3``, ``\\frac{7}{12}``, ``-\\frac{3}{4}``."""
    value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def _boxed(steps: str, answer: str) -> str:
    return f"{steps} So the answer is $\\boxed{{{answer}}}$."


def polynomial(coefficients: Sequence[int]) -> str:
    """LaTeX of a polynomial from its coefficients, highest degree first (zero terms dropped):
    ``[2, 0, -3, 1]`` -> ``2x^3 - 3x + 1``."""
    degree = len(coefficients) - 1
    out = ""
    for i, c in enumerate(coefficients):
        power = degree - i
        if c == 0:
            continue
        sign = "-" if c < 0 else "+"
        magnitude = abs(c)
        coef = "" if magnitude == 1 and power > 0 else str(magnitude)
        var = "" if power == 0 else "x" if power == 1 else f"x^{power}"
        out += (f"-{coef}{var}" if sign == "-" else f"{coef}{var}") if not out else f" {sign} {coef}{var}"
    return out or "0"


def _nonzero(rng: random.Random, low: int, high: int) -> int:
    value = 0
    while value == 0:
        value = rng.randint(low, high)
    return value


def integer_arithmetic(rng: random.Random) -> Draw:
    a, b, c, d = (rng.randint(2, 30) for _ in range(4))
    value = a * (b - c) + d**2
    text = f"Compute ${a} \\times ({b} - {c}) + {d}^2$."
    steps = f"${a} \\times ({b - c}) = {a * (b - c)}$ and ${d}^2 = {d * d}$, giving ${value}$."
    return text, str(value), _boxed(steps, str(value)), 1


def fraction_arithmetic(rng: random.Random) -> Draw:
    p = Fraction(rng.randint(1, 9), rng.randint(2, 12))
    q = Fraction(rng.randint(1, 9), rng.randint(2, 12))
    op = rng.choice(["+", "-", "\\times"])
    value = p + q if op == "+" else p - q if op == "-" else p * q
    text = (f"Compute $\\frac{{{p.numerator}}}{{{p.denominator}}} {op} \\frac{{{q.numerator}}}{{{q.denominator}}}$ "
            "and give the result as a reduced fraction.")
    answer = latex_number(value)
    return text, answer, _boxed(f"Combining the fractions gives ${answer}$.", answer), 1


def linear_equation(rng: random.Random) -> Draw:
    a = _nonzero(rng, -9, 9)
    c = rng.choice([v for v in range(-9, 10) if v not in (a, 0)])
    b, d = rng.randint(-20, 20), rng.randint(-20, 20)
    x = Fraction(d - b, a - c)
    text = f"Solve for $x$: ${a}x + {b} = {c}x + {d}$.".replace("+ -", "- ")
    answer = latex_number(x)
    steps = f"Collecting terms, ${a - c}x = {d - b}$, so $x = {answer}$."
    return text, answer, _boxed(steps, answer), 2


def quadratic_roots(rng: random.Random) -> Draw:
    r1 = rng.randint(-9, 9)
    r2 = rng.choice([Fraction(v) for v in range(-9, 10) if v != r1] + [Fraction(1, 2), Fraction(-3, 2)])
    k = 2 if r2.denominator == 2 else 1  # clear the denominator: k(x - r1)(x - r2)
    b = -k * (r1 + r2)
    c = k * r1 * r2
    terms = polynomial([k, int(b), int(c)])
    roots = sorted([Fraction(r1), r2])
    answer = "\\{" + ", ".join(latex_number(r) for r in roots) + "\\}"
    text = f"Find all roots of ${terms} = 0$. Give the set of roots."
    steps = f"The polynomial factors with roots ${latex_number(roots[0])}$ and ${latex_number(roots[1])}$."
    return text, answer, _boxed(steps, answer), 2


def gcd_lcm(rng: random.Random) -> Draw:
    base = rng.randint(2, 12)
    m, n = base * rng.randint(2, 15), base * rng.randint(2, 15)
    if rng.random() < 0.5:
        value, name = gcd(m, n), "greatest common divisor"
    else:
        value, name = lcm(m, n), "least common multiple"
    text = f"What is the {name} of ${m}$ and ${n}$?"
    return text, str(value), _boxed(f"Factoring ${m}$ and ${n}$, the {name} is ${value}$.", str(value)), 1


def derivative_at_point(rng: random.Random) -> Draw:
    a, b, c = _nonzero(rng, -5, 5), rng.randint(-9, 9), rng.randint(-9, 9)
    x0 = rng.randint(-4, 4)
    value = 3 * a * x0**2 + 2 * b * x0 + c
    text = f"Let $f(x) = {polynomial([a, b, c, rng.randint(-9, 9)])}$. Compute $f'({x0})$."
    steps = f"$f'(x) = {polynomial([3 * a, 2 * b, c])}$, so $f'({x0}) = {value}$."
    return text, str(value), _boxed(steps, str(value)), 2


def finite_sum(rng: random.Random) -> Draw:
    n = rng.randint(5, 40)
    if rng.random() < 0.5:
        a, d = rng.randint(-10, 10), _nonzero(rng, -5, 5)
        value = n * (2 * a + (n - 1) * d) // 2
        text = f"Compute $\\sum_{{k=0}}^{{{n - 1}}} ({a} + {d}k)$.".replace("+ -", "- ")
        steps = f"This arithmetic series has ${n}$ terms, so the sum is ${n}({2 * a} + {(n - 1) * d})/2 = {value}$."
    else:
        value = n * (n + 1) * (2 * n + 1) // 6
        text = f"Compute $\\sum_{{k=1}}^{{{n}}} k^2$."
        steps = f"Using $n(n+1)(2n+1)/6$ with $n = {n}$ gives ${value}$."
    return text, str(value), _boxed(steps, str(value)), 2


def modular_arithmetic(rng: random.Random) -> Draw:
    a, b, m = rng.randint(2, 30), rng.randint(5, 60), rng.randint(3, 23)
    value = pow(a, b, m)
    text = f"What is the remainder when ${a}^{{{b}}}$ is divided by ${m}$?"
    return text, str(value), _boxed(f"By repeated squaring modulo ${m}$, ${a}^{{{b}}} \\equiv {value}$.", str(value)), 3


FAMILIES: dict[str, Callable[[random.Random], Draw]] = {
    f.__name__: f
    for f in (integer_arithmetic, fraction_arithmetic, linear_equation, quadratic_roots, gcd_lcm,
              derivative_at_point, finite_sum, modular_arithmetic)
}


def single_digit_sum(rng: random.Random) -> Draw:
    """``Compute $a + b$.`` with single digits ``a, b``: an easy family for the offline tiny model.

    The sum is drawn first, uniformly from 0..18, then ``a`` uniformly among the digits that
    leave a digit ``b``: every answer has probability 1/19, so no constant answer scores more
    than about 5% (uniform digits would make 9 right 10% of the time)."""
    total = rng.randint(0, 18)
    a = rng.randint(max(0, total - 9), min(9, total))
    b = total - a
    return f"Compute ${a} + {b}$.", str(total), _boxed(f"${a} + {b} = {total}$.", str(total)), 1


#: Families selectable by name but outside the default rotation (``ProblemGenerator()`` never
#: draws them, so its problems stay what they were).
EXTRA_FAMILIES: dict[str, Callable[[random.Random], Draw]] = {f.__name__: f for f in (single_digit_sum,)}


def two_digit_sum(seed: int) -> Draw:
    """``Compute $a + b$.`` with two-digit ``a, b`` (8,100 distinct problems), split by content:
    seed ``base + i`` of a split (:func:`~env_server.debate.problems.splits.split_of_seed`) is
    item ``i`` (cycling) of that split's pairs, so RL, warm-up, validation and held-out problems
    never share a problem text, nor a problem with its commuted twin. Answers run from 20 to 198
    (the most frequent, 109 and 110, are about 1.1% of problems each). The reference solution
    works column by column (ones, then tens with the carry), so each step is a one-digit fact."""
    pairs = two_digit_pairs()[split_of_seed(seed)]
    a, b = pairs[split_index(seed) % len(pairs)]
    total = a + b
    ones = a % 10 + b % 10
    tens = a // 10 + b // 10 + ones // 10
    # worked column by column (ones, then tens with the carry): each step is a one-digit fact
    steps = (f"Ones: ${a % 10} + {b % 10} = {ones}$. Tens: ${a // 10} + {b // 10} + {ones // 10} = {tens}$. "
             f"So ${a} + {b} = {total}$.")
    return f"Compute ${a} + {b}$.", str(total), _boxed(steps, str(total)), 1


def long_division_steps(dividend: int, divisor: int) -> list[tuple[int, int, int]]:
    """The steps of dividing ``dividend`` by a one-digit ``divisor`` as :func:`exact_division`
    works them: ``(part, digit, remainder)`` per quotient digit, tens then ones, where ``part``
    is what is divided at that step (the dividend's leading digits, then the remainder with the
    ones digit brought down), ``digit = part // divisor`` and ``remainder = part % divisor``.

    Raises:
        ValueError: a divisor outside 2..9 or a dividend outside ``10 * divisor .. 99 * divisor``
            (a quotient that is not two digits)."""
    if not 2 <= divisor <= 9 or not 10 * divisor <= dividend <= 99 * divisor:
        raise ValueError(f"exact_division divides 10d..99d by a digit d in 2..9, got {dividend} / {divisor}")
    lead = dividend // 10
    tens, carried = lead // divisor, lead % divisor
    part = carried * 10 + dividend % 10
    return [(lead, tens, carried), (part, part // divisor, part % divisor)]


def exact_division(seed: int) -> Draw:
    """``Compute $n \\div d$.`` with a one-digit divisor ``d`` (2..9) and a two-digit quotient
    (10..99), ``n = q·d`` (720 problems), split by content as :func:`two_digit_sum` is
    (:func:`~env_server.debate.problems.splits.division_pairs`).

    A family where checking is cheaper than solving (issue 54; the generator-verifier gap of
    arXiv 2412.02674): the reference solution works the long division, two steps of "how many
    times does ``d`` go into this part, with what remainder" (404 distinct such facts over the
    family), while checking a proposed quotient multiplies it back, two one-digit products and a
    carry (80 facts: a digit times 2..9), and compares with ``n``. Answers are the quotient, 10..99."""
    pairs = division_pairs()[split_of_seed(seed)]
    quotient, divisor = pairs[split_index(seed) % len(pairs)]
    dividend = quotient * divisor
    (lead, tens, carried), (part, ones, _) = long_division_steps(dividend, divisor)
    steps = (f"Tens: ${lead} \\div {divisor} = {tens}$ remainder ${carried}$. "
             f"Ones: ${part} \\div {divisor} = {ones}$. So ${dividend} \\div {divisor} = {quotient}$.")
    return f"Compute ${dividend} \\div {divisor}$.", str(quotient), _boxed(steps, str(quotient)), 1


#: Families drawn from the seed's split (see :mod:`env_server.debate.problems.splits`); selectable
#: by name, outside the default rotation.
SPLIT_FAMILIES: dict[str, Callable[[int], Draw]] = {f.__name__: f for f in (two_digit_sum, exact_division)}

_SEEDED_FAMILIES: dict[str, Callable[[random.Random], Draw]] = {**FAMILIES, **EXTRA_FAMILIES}
_ALL_FAMILIES: dict[str, Callable[[random.Random], Draw] | Callable[[int], Draw]] = {**_SEEDED_FAMILIES, **SPLIT_FAMILIES}


class ProblemGenerator(ProblemSource):
    """Seeded problems from several families (see ``FAMILIES``).

    Args:
        families: these family names, from ``FAMILIES``, ``EXTRA_FAMILIES`` or ``SPLIT_FAMILIES``, in rotation
            order (default: all of ``FAMILIES``).

    Raises:
        ValueError: an unknown family name.
    """

    name = "built-in generator"
    SEEDS = 2**31

    def __init__(self, families: Sequence[str] | None = None) -> None:
        names = list(families) if families is not None else list(FAMILIES)
        unknown = [f for f in names if f not in _ALL_FAMILIES]
        if unknown or not names:
            raise ValueError(f"unknown problem families {unknown}; available: {', '.join(_ALL_FAMILIES)}")
        self.families = names

    def __len__(self) -> int:
        return self.SEEDS

    def by_seed(self, seed: int) -> Problem:
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        return self._make(self.families[seed % len(self.families)], seed % self.SEEDS)

    def fingerprint_problems(self) -> list[Problem]:
        """Two problems of each family (the seed space is too large to hash): a change of the
        families or of a family's code changes the fingerprint."""
        return [self.by_seed(seed) for seed in range(2 * len(self.families))]

    def get(self, problem_id: str) -> Problem:
        parts = problem_id.split("/")
        if len(parts) != 3 or parts[0] != "gen" or parts[1] not in self.families or not parts[2].isdigit():
            raise UnknownProblemError(
                f"unknown problem id {problem_id!r}: generated ids look like gen/<family>/<seed> "
                f"with family in {', '.join(self.families)}"
            )
        return self._make(parts[1], int(parts[2]))

    @staticmethod
    @lru_cache(maxsize=8192)  # a problem id is reset once per rollout of its group: generate it once
    def _make(family: str, seed: int) -> Problem:
        if family in SPLIT_FAMILIES:
            text, answer, solution, level = SPLIT_FAMILIES[family](seed)
        else:
            text, answer, solution, level = _SEEDED_FAMILIES[family](random.Random(f"{family}/{seed}"))
        return Problem(f"gen/{family}/{seed}", text, answer, solution, subject=family, level=level, source="generator")
