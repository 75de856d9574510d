"""Reading debate turns: the last ``\\boxed{}`` answer and the verifier's verdict.

Pure string operations, linear in the input, safe on the event loop: nothing here parses
mathematics (that is the grader's job, in worker processes).
"""

from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache
from typing import Literal

__all__ = ["last_boxed", "parse_verdict", "normalize_answer", "Verdict"]

Verdict = Literal["CORRECT", "INCORRECT"]

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_VERDICT = re.compile(r"VERDICT\s*[:：]?\s*[*_`\"']*\s*(INCORRECT|CORRECT)\b", re.IGNORECASE)
_NOISE = re.compile(r"\\[,;:! ]|\\left\b|\\right\b|\$")
_COMMAND_SPACE = re.compile(r"(\\[A-Za-z]+)\s+(?=[A-Za-z])")
_SPACE = re.compile(r"\s+")
_FRAC = re.compile(r"\\[dt]frac\b")
#: the only characters brace matching looks at: an escape pair, or a brace
_BRACE_TOKENS = re.compile(r"\\.|[{}]", re.DOTALL)


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``), brace-matched.

    One left-to-right pass with a stack of open braces, so the cost is linear even for
    hostile input (thousands of unclosed boxes). Escaped braces (``\\{``, ``\\}``) and escaped
    backslashes do not count.

    Args:
        text: a model response.

    Returns:
        The content between the braces, stripped (may be ``""`` for ``\\boxed{}``), or
        ``None`` when the text has no complete box. An unclosed last box (a response cut
        mid-answer) is skipped in favour of the previous complete one.
    """
    # Fast path, the common shape: a single ``\\boxed{`` (and no ``\\fbox``) whose content has no
    # brace or backslash. Then the first ``}`` after it closes it, and the scan below would
    # return the same text (nothing inside can open, close or escape a brace).
    start = text.find("\\boxed{")
    if start >= 0 and "\\fbox" not in text and text.count("\\boxed") == 1:
        close = text.find("}", start + 7)
        if close >= 0:
            content = text[start + 7 : close]
            if "{" not in content and "\\" not in content:
                return content.strip()
    return _last_boxed_scan(text)


def _last_boxed_scan(text: str) -> str | None:
    """``last_boxed`` for any text: brace matching over the whole text."""
    box_opens = {m.end() - 1 for m in _BOX_OPEN.finditer(text)}
    if not box_opens:
        return None
    best_open, best_close = -1, -1
    stack: list[int] = []
    # the regex skips ordinary characters in C; escape pairs (``\\{``, ``\\\\``) match as one token
    for match in _BRACE_TOKENS.finditer(text):
        token = match.group()
        if token == "{":
            stack.append(match.start())
        elif token == "}" and stack:
            opened = stack.pop()
            if opened in box_opens and opened > best_open:
                best_open, best_close = opened, match.start()
    return text[best_open + 1 : best_close].strip() if best_open >= 0 else None


def parse_verdict(text: str) -> Verdict | None:
    """The verifier's verdict: the last ``VERDICT: CORRECT`` / ``VERDICT: INCORRECT``.

    Case-insensitive; tolerates Markdown emphasis or quotes around the word
    (``VERDICT: **INCORRECT**``). Returns ``None`` when there is no verdict.
    """
    matches = _VERDICT.findall(text)
    return matches[-1].upper() if matches else None  # type: ignore[return-value]


def normalize_answer(answer: str) -> str:
    """A conservative canonical form of a LaTeX answer, for exact comparisons only.

    Removes whitespace (except the space ending a control word before a letter), ``$``, ``\\left``/``\\right`` and LaTeX spacing commands, and maps
    ``\\dfrac``/``\\tfrac`` to ``\\frac``: rewrites that cannot change a value. Used to detect
    repeated answers and as the grader's exact fast path (equal normal forms are equivalent;
    different ones go to math-verify).
    """
    if len(answer) <= _CACHED_CHARS:
        return _normalize_cached(answer)
    return _normalize(answer)


#: answers up to this length have their normal form cached (gold answers recur on every turn)
_CACHED_CHARS = 256


def _normalize(answer: str) -> str:
    text = _NOISE.sub("", answer)
    text = _COMMAND_SPACE.sub("\\1\x00", text)  # ``\pi r`` must not become ``\pir``
    text = _SPACE.sub("", text).replace("\x00", " ")
    return _FRAC.sub(r"\\frac", text).rstrip(".")


_normalize_cached = lru_cache(maxsize=16384)(_normalize)

_RATIONAL = re.compile(r"(-?)(?:(\d{1,60})|\\frac\{(-?\d{1,60})\}\{(\d{1,60})\})")


def exact_rational(answer: str) -> Fraction | None:
    """The value of an answer written as a plain integer or integer fraction, else ``None``.

    Accepts, after :func:`normalize_answer`, exactly ``-?digits`` and ``-?\\frac{-?digits}{digits}``
    (``\\dfrac``/``\\tfrac`` included), at most 60 digits per number, non-zero denominator.
    Anything else (decimals, percent, units, thousands separators, expressions) is ``None``, so
    the grader's symbolic path decides it. For two such answers math-verify's verdict is exact
    rational equality (the 60-digit rule of the grading policies), which this lets the grader
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
