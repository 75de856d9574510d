"""The grader's event-loop fast paths: exact rationals and closed-form numbers.

``exact_rational`` reads plain integers and integer fractions; ``closed_form_verdict`` decides a
pair of closed-form numbers (or a number against a container of several distinct ones) when the
grading policies' verdict is certain; ``undecorated`` takes the plain number out of one of the
decorations models write around it (``\\$18``, ``18 \\text{ dollars}``, ``x = 18``,
``\\mathbf{18}``), where the worker's verdict is that of the plain number. Pure string and
``Fraction`` code, no sympy, bounded work per call, so it is safe on the event loop; anything it
cannot decide goes to a grading worker.
"""

from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache
from math import isqrt

from env_server.debate.answers import normalize_answer
from env_server.protocol.grades import EXACT_DIGITS

__all__ = ["closed_form_verdict", "exact_rational", "is_plain_number", "undecorated"]

_DIGITS = rf"\d{{1,{EXACT_DIGITS}}}"
_RATIONAL = re.compile(rf"(-?)(?:({_DIGITS})|\\frac\{{(-?{_DIGITS})\}}\{{({_DIGITS})\}})")


def exact_rational(answer: str) -> Fraction | None:
    """The value of an answer written as a plain integer or integer fraction, else ``None``.

    Accepts, after :func:`normalize_answer`, exactly ``-?digits`` and ``-?\\frac{-?digits}{digits}``
    (``\\dfrac``/``\\tfrac`` included), at most ``EXACT_DIGITS`` (60) digits per number, non-zero denominator.
    Anything else (decimals, percent, units, thousands separators, expressions) is ``None``, so
    the grader's symbolic path decides it. For two such answers math-verify's verdict is exact
    rational equality (the ``EXACT_DIGITS`` rule of the grading policies), which this lets the grader
    decide without a worker.
    """
    match = _RATIONAL.fullmatch(normalize_answer(answer))
    if match is None:
        return None
    sign, integer, numerator, denominator = match.groups()
    if integer is not None:
        value = Fraction(int(integer))
    else:
        if int(denominator) == 0:
            return None
        value = Fraction(int(numerator), int(denominator))
    return -value if sign else value


# --- Decorated numbers: one decoration around a plain number ---
#
# Models write "\$18", "18 \text{ dollars}", "x = 18" or "\mathbf{18}" where the gold is "18". The
# worker (math-verify + the grading policies) grades each of these exactly as the plain number
# inside, so the grader can decide them on the event loop. Only these shapes, one decoration, a
# plain number (integer, decimal or integer fraction) inside; the worker's verdicts on them are
# pinned by tests/env_server/grading/test_fast_paths.py. Left to the worker on purpose, because
# the worker does not read them as the number: "\mathbf{\frac34}" and a bold number with a unit
# (unparseable or wrong there), a unit text that is "and" or "or" alone (unparseable), anything
# after the unit (e.g. a final period: unparseable), "x = y = 18", units outside "\text{}".

_PLAIN = r"-?(?:\d+(?:\.\d+)?|\\[dt]?frac\{\d+\}\{\d+\})"
_DECORATED = (
    re.compile(rf"\\\$\s*({_PLAIN})"),  # \$18
    # words separated by whitespace only, so the match cannot backtrack over ways to split them
    re.compile(rf"({_PLAIN})\s*\\(?:text|mbox)\{{\s*([A-Za-z]+(?:\s+[A-Za-z]+){{0,3}})\s*\}}"),  # 18 \text{ dollars}
    re.compile(rf"[A-Za-z]\s*=\s*({_PLAIN})"),  # x = 18
    re.compile(r"\\(?:mathbf|textbf)\{\s*(-?\d+)\s*\}"),  # \mathbf{18}
)
_PLAIN_NUMBER = re.compile(_PLAIN)
_UNPARSEABLE_UNITS = frozenset({"and", "or"})
_MAX_DECORATED_CHARS = 120


def is_plain_number(text: str) -> bool:
    """Whether ``text`` (surrounding whitespace ignored) is a plain number as
    :func:`undecorated` returns them: an integer, decimal or ``\\frac{a}{b}``, optionally
    negative. The decorated path compares against such golds only (a gold with its own unit or
    decoration goes to the worker)."""
    return len(text) <= _MAX_DECORATED_CHARS and _PLAIN_NUMBER.fullmatch(text.strip()) is not None


def undecorated(answer: str) -> str | None:
    """The plain number inside one decoration, or ``None`` when ``answer`` is not so written.

    Shapes (surrounding whitespace ignored; ``<n>`` an integer, decimal or ``\\frac{a}{b}``,
    optionally negative): ``\\$<n>``, ``<n> \\text{<1-4 words>}`` (also ``\\mbox``; the
    words letters only, and not one of them ``and`` or ``or``), ``<letter> = <n>``,
    ``\\mathbf{<integer>}`` / ``\\textbf{<integer>}``. The worker grades each of these as the
    number inside (tests pin it), so the grader may compare the number instead.
    """
    text = answer.strip()
    if len(text) > _MAX_DECORATED_CHARS:
        return None
    for index, pattern in enumerate(_DECORATED):
        match = pattern.fullmatch(text)
        if match is None:
            continue
        if index == 1 and _UNPARSEABLE_UNITS & set(match.group(2).lower().split()):
            return None
        return match.group(1)
    return None


# --- Closed-form numbers and containers of them, for the grader's "certainly different" path ---
#
# Our own code rather than math-verify's because it runs on the event loop, where nothing may
# parse mathematics with sympy: a tiny recursive-descent reader over a closed grammar, computing
# with Fraction intervals (never eval/sympify). Anything outside the grammar is None and goes to
# a worker. tests/env_server/grading/test_fast_paths.py checks every MATH-500 answer it reads against
# math-verify's parse, and its verdicts against the worker's on MATH-500 pairs.

Interval = tuple[Fraction, Fraction]

_VALUE_TOKEN = re.compile(r"\d+(?:\.\d+)?|\.\d+|\\[A-Za-z]+|\\\{|\\\}|[-+^{}()\[\],]")
_DEGREES = re.compile(r"\^(?:\\circ|\{\\circ\})$")
_COMMA_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")  # latex2sympy reads these as one number
_SPACED_DIGITS = re.compile(r"\d\s+\d")
_MAX_VALUE_CHARS = 120
_MAX_EXPONENT = 64
_SQRT_DIGITS = 40
#: pi to 20 decimals, rounded down and up
_PI: Interval = (Fraction(314159265358979323846, 10**20), Fraction(314159265358979323847, 10**20))
_INF = "inf"


#: largest numerator or denominator of an interval endpoint, in bits (about 10**616): past it
#: the answer goes to a worker (with its hard kill), so nested powers such as
#: ``{{9^{64}}^{64}}^{64}`` cannot hold the event loop in big-integer arithmetic
_MAX_BITS = 2048


class _NotClosedForm(Exception):
    pass


def _bounded(a: Interval) -> Interval:
    for end in a:
        if end.numerator.bit_length() > _MAX_BITS or end.denominator.bit_length() > _MAX_BITS:
            raise _NotClosedForm
    return a


def _mul(a: Interval, b: Interval) -> Interval:
    products = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])
    return _bounded((min(products), max(products)))


def _reciprocal(a: Interval) -> Interval:
    if a[0] <= 0 <= a[1]:
        raise _NotClosedForm
    return 1 / a[1], 1 / a[0]


def _sqrt(a: Interval) -> Interval:
    if a[0] < 0:
        raise _NotClosedForm  # complex: the worker decides
    if a[0] == a[1]:
        num, den = a[0].numerator, a[0].denominator
        if isqrt(num) ** 2 == num and isqrt(den) ** 2 == den:
            return (Fraction(isqrt(num), isqrt(den)),) * 2
    scale = 10 ** (2 * _SQRT_DIGITS)
    low = Fraction(isqrt(a[0].numerator * scale // a[0].denominator), 10**_SQRT_DIGITS)
    high = Fraction(isqrt(-(-a[1].numerator * scale // a[1].denominator)) + 1, 10**_SQRT_DIGITS)
    return low, high


class _Reader:
    r"""Reads the closed grammar (after :func:`normalize_answer`), values as Fraction intervals::

        expr   := [+-] term {(+|-) term}
        term   := power {[\cdot | \times] power}   (juxtaposition only before \sqrt or \pi)
        power  := atom [^ (digit | {[-]digits})]
        atom   := number | \pi | \frac arg arg | \sqrt arg | { expr }
        arg    := { expr } | one digit

    Deliberately excluded, because math-verify reads them in ways this reader would not:
    letters (units such as ``5m`` are stripped, ``e``/``i`` are constants), a number before
    ``\frac`` (a mixed number), ``\sqrt[n]``, percent, text, a digit after ``}`` or ``\pi``.
    """

    def __init__(self, text: str) -> None:
        self.tokens: list[str] = []
        end = 0
        for match in _VALUE_TOKEN.finditer(text):
            if match.start() != end:
                raise _NotClosedForm
            self.tokens.append(match.group())
            end = match.end()
        if end != len(text):
            raise _NotClosedForm
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise _NotClosedForm
        self.pos += 1
        return token

    def expr(self) -> Interval:
        sign = self.take() if self.peek() in ("+", "-") else "+"
        value = self.term()
        if sign == "-":
            value = (-value[1], -value[0])
        while self.peek() in ("+", "-"):
            op, other = self.take(), self.term()
            value = _bounded((value[0] + other[0], value[1] + other[1]) if op == "+"
                             else (value[0] - other[1], value[1] - other[0]))
        return value

    def term(self) -> Interval:
        value = self.power()
        while True:
            if self.peek() in ("\\cdot", "\\times"):
                self.take()
            elif self.peek() not in ("\\sqrt", "\\pi"):
                return value
            value = _mul(value, self.power())

    def power(self) -> Interval:
        value = self.atom()
        if self.peek() != "^":
            return value
        self.take()
        if self.peek() == "{":
            self.take()
            negative = self.peek() == "-" and bool(self.take())
            digits = self.take()
            self.take("}")
        else:
            negative, digits = False, self.take()
            if len(digits) != 1:  # ``x^23`` is ``x^2 3`` in TeX
                raise _NotClosedForm
        if not digits.isdigit() or int(digits) > _MAX_EXPONENT:
            raise _NotClosedForm
        result: Interval = (Fraction(1), Fraction(1))
        for _ in range(int(digits)):
            result = _mul(result, value)
        return _reciprocal(result) if negative else result

    def atom(self) -> Interval:
        token = self.take()
        if token[0].isdigit() or token[0] == ".":
            if len(token) > EXACT_DIGITS:
                raise _NotClosedForm
            return (Fraction(token),) * 2
        if token == "\\pi":
            return _PI
        if token == "\\frac":
            numerator, denominator = self.arg(), self.arg()
            return _mul(numerator, _reciprocal(denominator))
        if token == "\\sqrt":
            return _sqrt(self.arg())
        if token == "{":
            value = self.expr()
            self.take("}")
            return value
        raise _NotClosedForm

    def arg(self) -> Interval:
        token = self.peek()
        if token == "{":
            return self.atom()
        if token is None or not token.isdigit():
            raise _NotClosedForm
        if len(token) == 1:  # ``\frac34``: one digit per argument, as TeX reads it
            self.pos += 1
        else:
            self.tokens[self.pos] = token[1:]
        return (Fraction(int(token[0])),) * 2

    def read(self) -> Interval:
        value = self.expr()
        if self.peek() is not None:
            raise _NotClosedForm
        return value


def _split_top_level(text: str, separator: str) -> list[str]:
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        if text.startswith(("\\{", "\\}"), i):
            depth += 1 if text[i + 1] == "{" else -1
            i += 2
            continue
        char = text[i]
        if char in "{([":
            depth += 1
        elif char in "})]":
            depth -= 1
        elif depth == 0 and text.startswith(separator, i):
            parts.append(text[start:i])
            start = i + len(separator)
            i = start
            continue
        i += 1
    parts.append(text[start:])
    return parts


# Both readers are pure functions of a short text (at most _MAX_VALUE_CHARS) and a gold is
# read again on every turn of its problem: cache them.
@lru_cache(maxsize=16384)
def _value(text: str) -> Interval | None:
    try:
        return _Reader(text).read()
    except (_NotClosedForm, ZeroDivisionError, ValueError):
        return None


def _distinct(a: Interval, b: Interval) -> bool:
    return a[1] < b[0] or b[1] < a[0]


@lru_cache(maxsize=16384)
def _container(text: str) -> bool:
    """True when ``text`` is, for math-verify, a tuple, set, interval or union of intervals
    with at least two certainly distinct closed-form elements (or an interval of positive
    length): it can then never equal a single number. ``2,2`` is the set ``{2}`` and ``1,234``
    a number, so both are excluded."""
    parts = _split_top_level(text, "\\cup")
    if len(parts) > 1:
        return all(_interval(part) for part in parts)
    if _COMMA_NUMBER.fullmatch(text):
        return False
    for opening, closing in (("(", ")"), ("[", "]"), ("(", "]"), ("[", ")"), ("\\{", "\\}")):
        if text.startswith(opening) and text.endswith(closing):
            if opening != "\\{" and _interval(text):
                return True
            text = text[len(opening) : -len(closing)]
            break
    items = _split_top_level(text, ",")
    if len(items) < 2 or any(item.isdigit() and len(item) == 3 for item in items[1:]):
        return False  # ``1,000``-like items: possibly one number with a thousands separator
    values = [value for value in (_value(item) for item in items) if value is not None]
    if len(values) != len(items):
        return False
    return all(_distinct(a, b) for i, a in enumerate(values) for b in values[i + 1 :])


def _interval(text: str) -> bool:
    """An interval ``(a,b)``, ``[a,b]``, ``(a,b]``, ``[a,b)`` with ``a < b`` for certain
    (``\\infty`` endpoints allowed)."""
    if len(text) < 5 or text[0] not in "([" or text[-1] not in ")]":
        return False
    items = _split_top_level(text[1:-1], ",")
    if len(items) != 2:
        return False
    low = (Fraction(-1),) * 2 if items[0] == "-\\infty" else _value(items[0])
    high = (Fraction(1),) * 2 if items[1] in ("\\infty", "+\\infty") else _value(items[1])
    if items[0] == "-\\infty" and items[1] in ("\\infty", "+\\infty"):
        return True
    if items[0] == "-\\infty" and high is not None:
        return True
    if items[1] in ("\\infty", "+\\infty") and low is not None:
        return True
    return low is not None and high is not None and low[1] < high[0]


def _closed_form(answer: str) -> str | None:
    """The normal form of ``answer`` if it is short and has no digit-space-digit run
    (``1 000``: normalize_answer would join the digits, math-verify may not), else None."""
    if len(answer) > _MAX_VALUE_CHARS or _SPACED_DIGITS.search(answer):
        return None
    return normalize_answer(answer)


def closed_form_verdict(gold: str, answer: str, sig_figs: int) -> bool | None:
    """The grading policies' verdict when it follows from closed-form values alone, else None.

    Decides, without sympy, two kinds of pairs (a trailing ``^\\circ`` is dropped, as the
    degrees policy does):

    - both sides closed-form numbers (the :class:`_Reader` grammar: integers, decimals,
      ``\\frac``, ``\\sqrt``, ``\\pi``, ``+ - \\cdot``, integer powers), evaluated as rational
      intervals. *Equal* when both are the same exact rational (the 60-digit and the
      significant-figures rules both accept a zero difference). *Different* when the
      intervals are further apart than the loosest tolerance either rule allows,
      ``0.5 * 10**(1 - sig_figs) * |gold|`` (the significant-figures rule's tolerance is at
      most that; the exact rule's, ``|gold| * 1e-50``, is smaller). Otherwise None.
    - a closed-form number against a tuple, set, interval or union with two or more certainly
      distinct elements (:func:`_container`), either way round: never equal in math-verify
      (its set comparison wraps the number as a one-element set and compares sizes and
      contents), so *different*.

    Args:
        gold: reference answer (LaTeX, no ``\\boxed{}``).
        answer: extracted boxed answer.
        sig_figs: the grader's significant-figures setting.
    """
    gold_text, answer_text = _closed_form(gold), _closed_form(answer)
    if gold_text is None or answer_text is None:
        return None
    texts = [_DEGREES.sub("", gold_text), _DEGREES.sub("", answer_text)]
    values = [_value(t) for t in texts]
    if values[0] is not None and values[1] is not None:
        (g_low, g_high), (p_low, p_high) = values[0], values[1]
        if g_low == g_high == p_low == p_high:
            return True
        distance = max(p_low - g_high, g_low - p_high)
        tolerance = Fraction(1, 2) * Fraction(10) ** (1 - sig_figs) * max(abs(g_low), abs(g_high))
        if distance > tolerance * Fraction(1_000_001, 1_000_000) + Fraction(1, 10**30):
            return False
        return None
    if (values[0] is not None and _container(texts[1])) or (values[1] is not None and _container(texts[0])):
        return False
    return None
