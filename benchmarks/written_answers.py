"""Answers written as models write them: the ``written`` grading workload of ``grading.py``.

Each case is a gold answer, a response whose last ``\\boxed{}`` holds the answer in one written
form, and the truth (whether the written value equals the gold's), known by construction: a
right case writes the gold's own value in another form (``18`` as ``18.00``, ``\\$18``,
``18 \\text{ dollars}``, ``\\frac{36}{2}``, ...), a wrong case writes a different value (the
gold plus one, ten times it, its negation, another problem's answer) in a form drawn the same
way. Half the cases are right.

Golds come from GSM8K test answers (integers, thousands separators removed as the server's
loader does: ``env_server.debate.problems.jsonl.gsm8k_answer``) and from the built-in generator's
families (integers, signed fractions, sets of two roots), so the workload is not MATH-500's own
strings. ``cases(...)`` is deterministic for a seed; ``python benchmarks/written_answers.py OUT``
writes the case file (JSON lines: ``gold``, ``response``, ``truth``, ``form``, ``source``).
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from env_server.debate.problems.generator import ProblemGenerator  # noqa: E402  after the sys.path insert above
from env_server.debate.problems.jsonl import gsm8k_answer  # noqa: E402  after the sys.path insert above

GSM8K = REPO.parent / "shared" / "data" / "gsm8k_test.jsonl"
UNITS = ("dollars", "eggs", "minutes", "meters", "apples", "hours")


@dataclass(frozen=True)
class Case:
    """One grading case: ``response``'s last boxed answer against ``gold``; ``truth``: equal values."""

    gold: str
    response: str
    truth: bool
    form: str
    source: str


# ----------------------------------------------------------------------------- written forms
# Each form writes one value; a form that cannot write it returns None.


def _int_forms(n: int) -> dict[str, str | None]:
    unit = UNITS[abs(n) % len(UNITS)]
    return {
        "plain": str(n),
        "thousands": f"{n:,}" if abs(n) >= 1000 else None,
        "latex_thousands": f"{n:,}".replace(",", "{,}") if abs(n) >= 1000 else None,
        "decimal": f"{n}.0",
        "decimal_2": f"{n}.00",
        "dollar": f"\\${n}" if n >= 0 else None,
        "text_unit": f"{n} \\text{{ {unit}}}",
        "bare_unit": f"{n} {unit}",
        "assignment": f"x = {n}",
        "fraction": f"\\frac{{{2 * n}}}{{2}}",
        "bold": f"\\mathbf{{{n}}}",
        "scientific": (f"{n / 10 ** (len(str(abs(n))) - 1):g} \\times 10^{{{len(str(abs(n))) - 1}}}"
                       if abs(n) >= 100 and n % 10 == 0 else None),
    }


def _fraction_forms(value: Fraction) -> dict[str, str | None]:
    p, q = value.numerator, value.denominator
    sign, a = ("-" if p < 0 else ""), abs(p)
    decimal = None
    if all(f in (2, 5) for f in _prime_factors(q)):
        decimal = f"{float(value):.10f}".rstrip("0").rstrip(".")
    return {
        "frac": f"{sign}\\frac{{{a}}}{{{q}}}",
        "dfrac": f"{sign}\\dfrac{{{a}}}{{{q}}}",
        "slash": f"{sign}{a}/{q}",
        "signed_numerator": f"\\frac{{{p}}}{{{q}}}",
        "decimal": decimal,
        "unreduced": f"{sign}\\frac{{{2 * a}}}{{{2 * q}}}",
    }


def _set_forms(values: tuple[int, int]) -> dict[str, str | None]:
    a, b = values
    return {
        "set": f"\\{{{a}, {b}\\}}",
        "list": f"{a}, {b}",
        "reversed": f"{b}, {a}",
        "assignments": f"x = {a}, x = {b}",
        "reversed_set": f"\\{{{b},{a}\\}}",
    }


def _prime_factors(n: int) -> list[int]:
    factors, d = [], 2
    while d * d <= n:
        while n % d == 0:
            factors.append(d)
            n //= d
        d += 1
    return factors + ([n] if n > 1 else [])


# ----------------------------------------------------------------------------- values


Value = int | Fraction | tuple[int, int]
"""A gold's value: an integer, a (non-integer) fraction, or a set of two integer roots."""


def _parse_gold(gold: str) -> Value | None:
    """The value of the golds used here (integers, ``\\frac`` fractions, ``\\{a, b\\}``), else ``None``."""
    text = gold.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    if text.startswith("\\{") and text.endswith("\\}"):
        parts = text[2:-2].split(",")
        if len(parts) == 2 and all(p.strip().lstrip("-").isdigit() for p in parts):
            return int(parts[0]), int(parts[1])
        return None
    body, sign = (text[1:], -1) if text.startswith("-") else (text, 1)
    if body.startswith("\\frac{") and body.endswith("}"):
        num, _, den = body[len("\\frac{"):-1].partition("}{")
        if num.isdigit() and den.isdigit():
            return sign * Fraction(int(num), int(den))
    return None


def _forms(value: Value) -> dict[str, str | None]:
    """Every written form of ``value`` (``None`` where a form cannot write it)."""
    if isinstance(value, tuple):
        return _set_forms(value)
    if isinstance(value, Fraction) and value.denominator != 1:
        return _fraction_forms(value)
    return _int_forms(int(value))


def _wrong_value(value: Value, other: Value, rng: random.Random) -> Value:
    """A value of ``value``'s kind that differs from it (``other``: another gold's value)."""
    if isinstance(value, tuple):
        a, b = value
        return rng.choice([(a + 1, b), (a, b + 1), (-a, b) if a else (a, b + 2)])
    if isinstance(value, Fraction):
        f = value
        fractions = [f + 1, -f, 1 / f if f else Fraction(1, 2), f * 2]
        return rng.choice([c for c in fractions if c != f])
    n = value
    choices: list[Value] = [n + 1, n - 1, 10 * n if n else 7, -n if n else 3]
    if isinstance(other, int) and other != n:
        choices.append(other)
    return rng.choice(choices)


def _write(value: Value, rng: random.Random) -> tuple[str, str]:
    """``(form, text)``: ``value`` in a form drawn uniformly from those that can write it."""
    forms = [(name, text) for name, text in _forms(value).items() if text is not None]
    return rng.choice(forms)


def cases(gsm8k: Path = GSM8K, gsm8k_limit: int = 500, generated: int = 500, seed: int = 0) -> list[Case]:
    """The workload: for each gold (the first ``gsm8k_limit`` GSM8K test answers, then
    ``generated`` problems of the built-in generator, seeds 0..), one right and one wrong case,
    each in a drawn written form; shuffled with ``seed``."""
    rng = random.Random(seed)
    golds: list[tuple[str, str]] = []
    for line in gsm8k.read_text().splitlines()[:gsm8k_limit]:
        if line.strip():
            golds.append((gsm8k_answer(json.loads(line)["answer"]), "gsm8k"))
    generator = ProblemGenerator()
    golds += [(generator.by_seed(i).answer, f"gen/{generator.by_seed(i).problem_id.split('/')[1]}")
              for i in range(generated)]
    usable = [(gold, source, value) for gold, source in golds if (value := _parse_gold(gold)) is not None]
    out: list[Case] = []
    for i, (gold, source, value) in enumerate(usable):
        other = usable[(i + 7) % len(usable)][2]
        form, text = _write(value, rng)
        out.append(Case(gold, f"So the final answer is $\\boxed{{{text}}}$.", True, form, source))
        wrong = _wrong_value(value, other, rng)
        form, text = _write(wrong, rng)
        out.append(Case(gold, f"So the final answer is $\\boxed{{{text}}}$.", False, form, source))
    rng.shuffle(out)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python benchmarks/written_answers.py OUT.jsonl", file=sys.stderr)
        return 2
    rows = cases()
    Path(args[0]).write_text("".join(json.dumps(asdict(c)) + "\n" for c in rows))
    print(f"{len(rows)} cases ({sum(c.truth for c in rows)} right) -> {args[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
