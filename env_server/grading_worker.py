"""Answer checking with math-verify: what runs inside a grading worker process.

This module imports sympy and math-verify (heavy, and unsafe to run on the event loop), so
only worker processes, benchmarks and tests import it; the server process does not.

Never passes model text to ``eval``, ``sympify`` or ``parse_expr``: parsing goes through
math-verify's ANTLR LaTeX grammar only (``LatexExtractionConfig``; its plain-expression path,
the one place math-verify calls ``parse_expr``, is not enabled).

Grading policies (pinned by ``tests/test_grading_policies.py``):

- Gold first: ``verify(gold, pred)`` is asymmetric by design, gold is always the first argument.
- Scalars (numbers and closed-form numeric expressions on both sides) are compared here, not
  by math-verify's numeric step, whose 6-decimal rounding and ``evalf(chop=True)`` call
  ``1/2^60`` and ``1/2^61`` equal:
    - exact vs exact: equal iff their difference is zero at 60 significant digits
      (relative 1e-50), so ``1/2^60 != 1/2^61``, ``1-1/e != 1+1/e``, ``\\sqrt{8} == 2\\sqrt{2}``;
    - a decimal on either side: equal iff it agrees with the gold to ``sig_figs``
      significant figures (default 6): ``|g - p| <= 0.5 * 10**(floor(log10|g|) - sig_figs + 1)``.
      So ``0.333333`` matches ``\\frac13`` but ``0.33`` does not; ``3.14159`` matches ``\\pi``.
- Percent: a percent and its number are interchangeable both ways (gold ``28\\%`` accepts
  ``28``, ``28\\%`` and ``0.28``; gold ``28`` accepts ``28\\%``), as math-verify does.
- Units and ``\\text{}`` unit words are stripped (``42`` matches ``42\\text{ cm}^2``); degrees
  are dropped without conversion (``90^\\circ`` matches ``90``, not ``\\frac{\\pi}{2}``).
- Unreduced fractions are accepted (``\\frac{2}{4}`` matches ``\\frac12``).
- Tuples are ordered, sets are not: ``(1,2) != (2,1)``; ``\\{1,2\\} == \\{2,1\\}``; a bare
  list ``1, 2`` is a set (quadratic roots in any order).
- Text answers compare case-insensitively as math-verify symbols (``\\text{Monday}``).
- ``\\mathrm{e}`` is Euler's number (math-verify cannot parse it otherwise).
"""

from __future__ import annotations

import math
import re
from functools import lru_cache

import sympy
from math_verify import LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException
from math_verify.grader import get_pct_val, safe_sympy_doit
from math_verify.utils import timeout
from sympy import Basic, Expr, Float, MatrixBase
from sympy.core.relational import Relational
from sympy.sets.sets import Set

__all__ = ["grade_answer", "GradeOutcome"]

#: (correct, error_kind) where error_kind is None, "unparseable_answer" or "grading_timeout".
GradeOutcome = tuple[bool, "str | None"]

# Boxed answers only: no anchor-free extraction, boxed wins over "final answer is".
_EXTRACTION = [LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)]
_MATHRM_E = re.compile(r"\\(?:mathrm|operatorname|textrm|mathit)\s*(?:\{\s*e\s*\}|e\b)")
_EXACT_DIGITS = 60


def _prepare(latex: str) -> str:
    """Rewrite the few spellings math-verify mis-parses, then box the answer for parsing."""
    return "\\boxed{" + _MATHRM_E.sub("e", latex) + "}"


@lru_cache(maxsize=8192)
def _parse_gold(gold: str, timeout_s: int) -> tuple:
    """Parse a gold answer once per worker (cached): sympy objects plus a string fallback."""
    return tuple(parse(_prepare(gold), _EXTRACTION, fallback_mode="first_match",
                       parsing_timeout=timeout_s, raise_on_error=True))


def _is_scalar(x: object) -> bool:
    return (
        isinstance(x, Expr)
        and not isinstance(x, (Relational, Set, MatrixBase))
        and not x.free_symbols
        and not x.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan)
    )


def _candidates(x: Expr) -> list[Expr]:
    """Values a scalar may stand for: a percent is both ``v/100`` and ``v``."""
    pct = get_pct_val(x)
    value = safe_sympy_doit(x)
    return [value] if pct is None else [value, pct]


def _scalars_equal(gold: Expr, pred: Expr, sig_figs: int) -> bool:
    for g in _candidates(gold):
        for p in _candidates(pred):
            inexact = g.has(Float) or p.has(Float)
            gv = sympy.N(g, _EXACT_DIGITS)
            pv = sympy.N(p, _EXACT_DIGITS)
            if not (gv.is_number and pv.is_number) or gv.has(sympy.I) or pv.has(sympy.I):
                # complex or unevaluable: exact structural/symbolic check only
                if sympy.N(g - p, _EXACT_DIGITS) == 0:
                    return True
                continue
            diff = abs(gv - pv)
            if not inexact:
                if diff <= abs(gv) * sympy.Float(10) ** (-50):
                    return True
                continue
            if gv == 0:
                if pv == 0:
                    return True
                continue
            exponent = math.floor(math.log10(float(abs(gv))))
            if diff <= 0.5 * sympy.Float(10) ** (exponent - sig_figs + 1):
                return True
    return False


def _pair_equal(gold: object, pred: object, sig_figs: int, timeout_s: int) -> bool:
    """One (gold, pred) pair: our scalar policy when both are scalars, else math-verify."""
    if _is_scalar(gold) and _is_scalar(pred):
        try:
            return timeout(timeout_s)(_scalars_equal)(gold, pred, sig_figs)
        except TimeoutException:
            raise
        except Exception:
            pass  # an expression our policy cannot evaluate: let math-verify decide
    return verify(gold, pred, timeout_seconds=timeout_s, raise_on_error=True)


def _compare(gold_parsed: tuple, pred_parsed: list, sig_figs: int, timeout_s: int) -> tuple[bool, bool]:
    """Any-pair equivalence over math-verify's candidate lists (as ``verify`` does), with
    per-pair error handling so that one failing pair cannot hide another's match.

    Returns:
        ``(equal, timed_out)``: ``timed_out`` is True when no pair matched and at least one
        comparison hit the soft timeout.
    """
    timed_out = False
    for gold in gold_parsed:
        for pred in pred_parsed:
            try:
                if _pair_equal(gold, pred, sig_figs, timeout_s):
                    return True, False
            except TimeoutException:
                timed_out = True
            except Exception:
                continue
    return False, timed_out


def grade_answer(gold: str, answer: str, sig_figs: int = 6, timeout_s: int = 3) -> GradeOutcome:
    """Decide whether ``answer`` is equivalent to ``gold`` under the documented policies.

    Must run in a process's main thread (math-verify's timeouts use ``signal.alarm``); the
    server calls it in worker processes that it can also kill at a hard wall-clock limit.

    Args:
        gold: reference answer, LaTeX without ``\\boxed{}``.
        answer: the content of the response's last ``\\boxed{}`` (already extracted and
            capped by the caller).
        sig_figs: significant figures a decimal answer must agree to.
        timeout_s: math-verify's soft timeout per parse/compare, seconds (integer).

    Returns:
        ``(correct, error_kind)``: ``error_kind`` is ``"unparseable_answer"`` when the answer
        does not parse (and is not string-identical to an unparseable gold), or
        ``"grading_timeout"`` when a soft timeout fired; else ``None``.
    """
    try:
        gold_parsed = _parse_gold(gold, timeout_s)
        pred_parsed = parse(_prepare(answer), _EXTRACTION, fallback_mode="first_match",
                            parsing_timeout=timeout_s, raise_on_error=True)
        if not any(isinstance(p, (Basic, MatrixBase)) for p in pred_parsed):
            # No math in the answer: only an exact string match with a text gold counts.
            same = any(isinstance(g, str) and g.strip() == answer.strip() for g in gold_parsed)
            return (True, None) if same else (False, "unparseable_answer")
        equal, timed_out = _compare(gold_parsed, pred_parsed, sig_figs, timeout_s)
        return (True, None) if equal else (False, "grading_timeout" if timed_out else None)
    except TimeoutException:
        return False, "grading_timeout"
    except (RecursionError, MemoryError):  # resource limits count as a failed grade
        return False, "grading_timeout"
    except Exception:  # math-verify/sympy failure on hostile or malformed input
        return False, "unparseable_answer"
