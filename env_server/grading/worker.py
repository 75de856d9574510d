"""Answer checking with math-verify: what runs inside a grading worker process.

This module imports sympy and math-verify (heavy, and unsafe to run on the event loop), so
only worker processes, benchmarks and tests import it; the server process does not.

Never passes model text to ``eval``, ``sympify`` or ``parse_expr``: parsing goes through
math-verify's ANTLR LaTeX grammar only (``LatexExtractionConfig``; its plain-expression path,
the one place math-verify calls ``parse_expr``, is not enabled).

Grading policies (pinned by ``tests/env_server/grading/test_worker.py``):

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

Speed (verdicts unchanged; figures in ``benchmarks/README.md``):

- Two-stage ANTLR parsing (:func:`_use_two_stage_parsing`): the LaTeX grammar is parsed first
  in ANTLR's SLL prediction mode, and again in full LL mode only if SLL reports a syntax error.
  ANTLR documents that SLL either returns the same tree as LL or fails, so results are
  identical; SLL avoids full-context prediction, most of the parse time.
- Parses are cached per worker (:func:`_parse_latex`), for golds and short answers alike: a
  gold recurs on every turn of its problem, and one problem's answer is often another's gold.
- :func:`warm_up` parses and compares a fixed set of generic answer shapes once in the
  forkserver (``env_server.grading.preload``), so every worker, replacements included, forks
  with ANTLR's prediction DFA and sympy's caches already filled; a cold worker parses markedly
  slower. The set is generic LaTeX, not benchmark data, and no verdict is kept.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Any

import sympy
from antlr4.atn.PredictionMode import PredictionMode
from math_verify import LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException
from math_verify.grader import get_pct_val, safe_sympy_doit
from math_verify.utils import timeout
from sympy import Basic, Expr, Float, MatrixBase
from sympy.core.relational import Relational
from sympy.sets.sets import Set

from env_server.protocol.grades import EXACT_DIGITS

__all__ = ["GradeOutcome", "grade_answer", "warm_up"]

#: (correct, error_kind) where error_kind is None, "unparseable_answer" or "grading_timeout".
GradeOutcome = tuple[bool, "str | None"]

# Boxed answers only: no anchor-free extraction, boxed wins over "final answer is".
_EXTRACTION = [LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)]
_MATHRM_E = re.compile(r"\\(?:mathrm|operatorname|textrm|mathit)\s*(?:\{\s*e\s*\}|e\b)")
#: answers up to this length have their parse cached (golds always do)
_CACHED_PARSE_CHARS = 512


def _use_two_stage_parsing() -> None:
    """Make latex2sympy parse with ANTLR's two-stage strategy: SLL first, full LL on failure.

    latex2sympy's ``PSParser`` always predicts in full LL mode, whose full-context
    prediction is most of its parse time. ANTLR's documented guarantee for SLL mode is
    that it "either returns a correct parse tree (the same parse tree that would be returned
    with the LL prediction mode), or it will report a syntax error"; latex2sympy's error
    listener turns every syntax error into an exception, so on any exception we parse again in
    LL mode and the result is the one LL alone gives. The input is lexed in full before the SLL
    attempt, so both attempts read the same tokens and a lexer error raises before either (LL
    alone raises too: the grammar's ``math`` rule ends at EOF, so it lexes all the input; the
    callers, latex2sympy and math-verify, treat every exception alike). Our own code rather
    than a math-verify option because math-verify exposes none.
    ``TimeoutException`` (math-verify's soft timeout) derives from ``BaseException`` and is not
    caught, so a timed-out parse is not retried.
    """
    from latex2sympy2_extended import latex2sympy2 as l2s

    base = l2s.PSParser
    if getattr(base, "two_stage", False):
        return

    class TwoStagePSParser(base):  # type: ignore[misc, valid-type]  # base: latex2sympy's PSParser, untyped, held in a variable
        two_stage = True

        def math(self) -> Any:  # the parse tree of latex2sympy's grammar (untyped ANTLR context)
            # Lex the whole input first. A lexer error (an unknown command such as ``\zzz``)
            # raises here, before any parse, as LL alone would raise (its ``math`` rule must
            # reach EOF); lexed lazily, it was raised inside the SLL attempt after the lexer
            # had skipped the bad character, so the rewound stream held other tokens and the LL
            # retry succeeded where LL alone fails (``1 = \zzz = x = 0`` became a chain of
            # relations rather than falling back, as in math-verify, to its last value ``0``).
            self._input.fill()
            self._interp.predictionMode = PredictionMode.SLL
            try:
                return super().math()
            except Exception:
                self.reset()  # rewinds the (complete) token stream
                self._interp.predictionMode = PredictionMode.LL
                return super().math()

    l2s.PSParser = TwoStagePSParser


_use_two_stage_parsing()


def _certainly_nonzero_polynomial(diff: Basic) -> bool:
    """True when ``diff`` is a polynomial in its free symbols with a non-constant term whose
    coefficient is a non-zero rational: such a polynomial is not identically zero, so
    ``simplify(diff).is_zero`` cannot be True. Conservative: False whenever unsure."""
    symbols = diff.free_symbols
    if not symbols or not diff.is_polynomial(*symbols):
        return False
    terms = sympy.Poly(diff, *symbols).terms()
    return any(any(monomial) and coeff.is_Rational and coeff != 0 for monomial, coeff in terms)


def _use_quick_symbolic_inequality() -> None:
    """Skip math-verify's ``simplify(a - b)`` when ``a - b`` is certainly a non-zero polynomial.

    ``sympy_symbolic_eq`` (math-verify's last resort, ``simplify(a - b).is_zero``) is the
    slowest step of a wrong answer such as ``8n^2 + 4n + 1`` against ``144``. When
    the difference is a polynomial with a non-constant rational term it cannot simplify to zero
    (:func:`_certainly_nonzero_polynomial`), so the verdict (False) is the one simplify would
    give. Our own code because math-verify has no such shortcut; every other case still calls
    math-verify's function.
    """
    import math_verify.grader as mv_grader

    original = mv_grader.sympy_symbolic_eq
    if getattr(original, "quick", False):
        return

    def sympy_symbolic_eq(a: object, b: object) -> bool:
        try:
            if isinstance(a, Expr) and isinstance(b, Expr) and _certainly_nonzero_polynomial(a - b):
                return False
        except Exception:
            pass  # undecided: math-verify decides
        return bool(original(a, b))

    sympy_symbolic_eq.quick = True  # type: ignore[attr-defined]  # a marker on the function, read back with getattr
    mv_grader.sympy_symbolic_eq = sympy_symbolic_eq


_use_quick_symbolic_inequality()


def _prepare(latex: str) -> str:
    """Rewrite the few spellings math-verify mis-parses, then box the answer for parsing."""
    return "\\boxed{" + _MATHRM_E.sub("e", latex) + "}"


def _parse_uncached(latex: str, timeout_s: int) -> tuple[Any, ...]:
    """math-verify's parse of one boxed answer: sympy objects plus a string fallback."""
    return tuple(parse(_prepare(latex), _EXTRACTION, fallback_mode="first_match",
                       parsing_timeout=timeout_s, raise_on_error=True))


#: Parses kept per worker (golds and short answers; failures are not cached).
_parse_latex = lru_cache(maxsize=8192)(_parse_uncached)


def _parse_answer(answer: str, timeout_s: int) -> tuple[Any, ...]:
    """An answer's parse, cached when short (long answers are rarely repeated)."""
    return _parse_latex(answer, timeout_s) if len(answer) <= _CACHED_PARSE_CHARS else _parse_uncached(answer, timeout_s)


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
            gv = sympy.N(g, EXACT_DIGITS)
            pv = sympy.N(p, EXACT_DIGITS)
            if not (gv.is_number and pv.is_number) or gv.has(sympy.I) or pv.has(sympy.I):
                # complex or unevaluable: exact structural/symbolic check only
                if sympy.N(g - p, EXACT_DIGITS) == 0:
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
            return bool(timeout(timeout_s)(_scalars_equal)(gold, pred, sig_figs))
        except TimeoutException:
            raise
        except Exception:
            pass  # an expression our policy cannot evaluate: let math-verify decide
    return bool(verify(gold, pred, timeout_seconds=timeout_s, raise_on_error=True))


def _compare(gold_parsed: tuple[Any, ...], pred_parsed: tuple[Any, ...], sig_figs: int, timeout_s: int) -> tuple[bool, bool]:
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
        answer: the response's final answer (``answers.final_answer``: the last ``\\boxed{}``'s
            content, or adjacent boxes' contents joined by ``", "``), already extracted and
            capped by the caller.
        sig_figs: significant figures a decimal answer must agree to.
        timeout_s: math-verify's soft timeout per parse/compare, seconds (integer).

    Returns:
        ``(correct, error_kind)``: ``error_kind`` is ``"unparseable_answer"`` when the answer
        does not parse (and is not string-identical to an unparseable gold), or
        ``"grading_timeout"`` when a soft timeout fired; else ``None``.
    """
    try:
        gold_parsed = _parse_latex(gold, timeout_s)
        pred_parsed = _parse_answer(answer, timeout_s)
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


#: Generic answer shapes for :func:`warm_up` (made up here, not taken from any benchmark):
#: numbers, fractions, radicals, decimals, percent, degrees, units, text, tuples, intervals,
#: sets, matrices, equations, polynomials, complex numbers, base subscripts. ANTLR's prediction
#: DFA is keyed by token-type sequences, so shapes matter, not values.
_WARM_UP_SHAPES = [
    "7", "-3", "1,234", r"5,\!000", "2.5", ".125", r"15\%", r"45^\circ", r"30^{\circ}", r"\$4.50", r"\$12",
    r"\frac{2}{3}", r"-\dfrac 58", r"\frac9{14}", r"\frac{\sqrt{3}}{2}", r"2\sqrt{2}", r"\sqrt[3]{4}", r"3\pi",
    r"\frac{\pi}{4}", r"-\frac{5\pi}{6}", r"\frac{3\sqrt{5}}{7}", r"4 + 2\sqrt{3}", r"\frac{1+\sqrt{5}}{2}", r"\pi^2",
    r"\frac{\pi^2}{6}", r"2^{10}", r"1\frac{1}{2}", r"12 \text{ cm}^2", r"6\mbox{ inches}", r"7 \text{ dollars}",
    r"\text{(B)}", r"\textbf{(D)}", r"\text{Tuesday}", r"\mbox{odd}", r"\text{circle}", "C",
    r"(1,-2)", r"(3, 4, -5)", r"\left( 2, \frac{\pi}{3} \right)", r"\left[ \frac{1}{2}, \frac{3 \pi}{4} \right]",
    r"(-\infty, 1) \cup (2, \infty)", r"[0, 5)", r"(3, 7]", r"(-\infty, 0]", r"(4, \infty)", r"(1,2) \cup (2,5)",
    r"\{1, 3\}", "4, -1", r"-2, 3, 5", r"1 \pm \sqrt{3}", r"\{2 \pm \sqrt{7}, -1\}", r"x \in [1, 4]",
    r"\begin{pmatrix} 1 \\ -2 \end{pmatrix}", r"\begin{pmatrix} 1/3 \\ 2 \\ -5/3 \end{pmatrix}",
    r"\begin{pmatrix} 1 & 0 \\ 0 & 1 \end{pmatrix}", "y = 3x - 2", "x = 5", "2x + 3y - z + 1 = 0",
    "x^2 + 2x - 3", r"x^4 - x^3 + x - 1", "4n^2 + n + 2", "3r^2 - 2r - 8", "10x - 7", "5a^3", "2k", "2m + 1",
    "p + q", r"(x-1)(x+3)", r"(a+2)(b-1)", r"\frac{x+1}{x-1}", r"\frac{2+3a}{5}", r"\pi r^2", "3 + 4i",
    r"-1 - 7i", r"2 - \sqrt{2}i", "101_2", "27_{8}", r"\sin x", r"\cot \theta", r"\log_2 8", r"e^{2}", r"\binom{5}{2}",
    "4!", r"\infty",
]


def warm_up() -> None:
    """Parse and compare :data:`_WARM_UP_SHAPES` pairwise (neighbours), then drop the parse cache.

    Run in the forkserver (``env_server.grading.preload``) so that workers fork with ANTLR's
    prediction DFA and sympy's caches filled (a fresh worker otherwise parses each new answer
    shape markedly slower; ``benchmarks/README.md``). Nothing is kept that could answer a grade: the parse cache is
    cleared and verdicts are not stored.
    """
    shapes = _WARM_UP_SHAPES
    for i, gold in enumerate(shapes):
        for answer in (shapes[i - 1], shapes[(i + 7) % len(shapes)], shapes[(i + 31) % len(shapes)]):
            grade_answer(gold, answer)
    _parse_latex.cache_clear()
