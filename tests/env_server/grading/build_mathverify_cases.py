"""Build ``mathverify_cases.jsonl``: the answer pairs and expected verdicts of math-verify 0.9.0's
own test suite, with math-verify's verdict on each, for ``test_mathverify_parity.py``.

Run by hand, not by pytest (the name does not start with ``test_``)::

    pip download math-verify==0.9.0 --no-binary :all: --no-deps -d /tmp/mv
    python tests/env_server/grading/build_mathverify_cases.py /tmp/mv/math_verify-0.9.0.tar.gz

The source distribution on PyPI ships the tests (the wheel does not); its SHA-256 is checked
against :data:`SDIST_SHA256`. The script imports each test module of the sdist (as pytest would
collect it), reads the ``pytest.mark.parametrize`` values of every test that compares a gold with
a prediction, and reads from the test function's source which options it passes
(``match_types``, ``precision``, ``strict``, ``allow_set_relation_comp``). Tests that check other
things (parser configuration objects, timeouts with mocks, string extraction, error propagation)
have no answer pair and are left out; ``test_precision``'s one string comparison, written inline
rather than parametrized, is read from its source. Then it runs math-verify (the installed
version, which must be 0.9.0) on every pair with those options, the way the test's helper calls
it, and records that verdict as ``math_verify`` and the answer text its parse extracted from the
gold and the prediction as ``gold_answer`` and ``pred_answer``. The pairs and verdicts are facts about that
suite; the test code itself is not copied. Details: ``mathverify_cases.md``.

The cases of issue 46 (:data:`ISSUE_CASES`), which come from no suite, are appended with
``"file": "issue-46"``.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib
import inspect
import json
import sys
import tarfile
import tempfile
import textwrap
from importlib.metadata import version
from pathlib import Path
from typing import Any

SDIST_SHA256 = "45ac6c61344ba056b9e99a660a4bc8d044ed408f730aed68c60435aa5eec4645"
OUT = Path(__file__).with_name("mathverify_cases.jsonl")
#: the test helper's defaults (``compare_strings`` in math-verify's tests/test_all.py)
DEFAULTS = {"match_types": ["latex", "expr"], "precision": 6, "strict": True, "allow_set_relation_comp": False}
#: modules with answer pairs, in the order written
MODULES = ["test_all", "test_boxed", "test_numina_cases", "test_open_thoughts", "test_strict", "test_yujianll"]
#: issue 46's own pairs (gold, prediction, expected): the forms the issue names, and the written-answers
#: benchmark's ``2.3 \times 10^{2}`` (benchmarks/written_answers.py, form "scientific")
ISSUE_CASES = [
    ("4", r"The answer is \boxed 4", True),
    ("7", r"So we get $\boxed 7$ as the answer.", True),
    ("230", r"So the final answer is $\boxed{2.3 \times 10^{2}}$.", True),
]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _call_options(function: Any) -> tuple[str, dict[str, Any]] | None:
    """How ``function`` compares its pair: ``("compare_strings", options)`` with each option a
    literal or the name of a parameter (``"$name"``), ``("parse_verify", {})`` for
    ``verify(parse(gold), parse(pred))``, or None for a test without such a call."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        if node.func.id == "compare_strings":
            options: dict[str, Any] = {}
            for keyword in node.keywords:
                value = keyword.value
                options[str(keyword.arg)] = f"${value.id}" if isinstance(value, ast.Name) else ast.literal_eval(value)
            return "compare_strings", options
        if node.func.id == "verify" and all(isinstance(a, ast.Call) and getattr(a.func, "id", "") == "parse"
                                            for a in node.args):
            return "parse_verify", {}
    return None


def _inline_pairs(function: Any) -> list[dict[str, Any]]:
    """``assert compare_strings("<gold>", "<pred>", ...) == <expected>`` statements in a test
    that is not parametrized (``test_precision``)."""
    pairs = []
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Compare) and isinstance(node.left, ast.Call)
                and getattr(node.left.func, "id", "") == "compare_strings"):
            continue
        gold, pred = (ast.literal_eval(a) for a in node.left.args[:2])
        options = {str(k.arg): ast.literal_eval(k.value) for k in node.left.keywords}
        pairs.append({"gold": gold, "pred": pred, "expected": bool(ast.literal_eval(node.comparators[0])),
                      "config": {**DEFAULTS, **options}, "call": "compare_strings"})
    return pairs


def _cases(tests_dir: Path) -> list[dict[str, Any]]:
    sys.path.insert(0, str(tests_dir.parent))  # ``from tests.test_all import compare_strings``
    cases: list[dict[str, Any]] = []
    for name in MODULES:
        module = importlib.import_module(f"tests.{name}")
        for test_name, function in inspect.getmembers(module, inspect.isfunction):
            if not test_name.startswith("test_") or function.__module__ != module.__name__:
                continue
            marks = [m for m in getattr(function, "pytestmark", []) if m.name == "parametrize"]
            call = _call_options(function)
            if not marks:
                for index, pair in enumerate(_inline_pairs(function)):
                    cases.append({"id": f"{name}.py::{test_name}[{index}]", "file": f"tests/{name}.py",
                                  "test": test_name, **pair})
                continue
            if call is None:
                continue
            argnames = [a.strip() for a in marks[0].args[0].split(",")]
            for index, values in enumerate(marks[0].args[1]):
                row = dict(zip(argnames, values, strict=True))
                expected = row.get("expected", row.get("result"))
                kind, options = call
                config = dict(DEFAULTS) if kind == "compare_strings" else {}
                for key, value in options.items():
                    config[key] = row[value[1:]] if isinstance(value, str) and value.startswith("$") else value
                cases.append({"id": f"{name}.py::{test_name}[{index}]", "file": f"tests/{name}.py", "test": test_name,
                              "gold": row["gold"], "pred": row["pred"], "expected": bool(expected),
                              "config": config, "call": kind})
    return cases


def math_verify_reading(case: dict[str, Any]) -> dict[str, Any]:
    """math-verify's verdict on a case, called with the options its test passes, and the answer
    text it extracted from each side (the string of its parse; None when it extracted nothing)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    if case["call"] == "parse_verify":
        gold, pred = parse(case["gold"]), parse(case["pred"])
        verdict = verify(gold, pred)
    else:
        config = case["config"]
        targets = [LatexExtractionConfig(boxed_match_priority=0) if kind == "latex" else ExprExtractionConfig()
                   for kind in config["match_types"]]
        gold, pred = parse(case["gold"], targets), parse(case["pred"], targets)
        verdict = verify(gold, pred, float_rounding=config["precision"], strict=config["strict"],
                         allow_set_relation_comp=config["allow_set_relation_comp"])

    def text(parsed: list[Any]) -> str | None:
        return next((item for item in reversed(parsed) if isinstance(item, str)), None)

    return {"math_verify": bool(verdict), "gold_answer": text(gold), "pred_answer": text(pred)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sdist", type=Path, help="math_verify-0.9.0.tar.gz from PyPI")
    args = parser.parse_args(argv)
    if _sha256(args.sdist) != SDIST_SHA256:
        parser.error(f"{args.sdist}: SHA-256 is not that of math_verify-0.9.0.tar.gz ({SDIST_SHA256})")
    if version("math-verify") != "0.9.0":
        parser.error(f"math-verify {version('math-verify')} installed; the verdicts are 0.9.0's")
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(args.sdist) as archive:
            archive.extractall(tmp, filter="data")
        cases = _cases(Path(tmp) / "math_verify-0.9.0" / "tests")
    for index, (gold, pred, expected) in enumerate(ISSUE_CASES):
        cases.append({"id": f"issue-46[{index}]", "file": "issue-46", "test": "issue-46", "gold": gold, "pred": pred,
                      "expected": expected, "config": dict(DEFAULTS), "call": "compare_strings"})
    for case in cases:
        case.update(math_verify_reading(case))
    OUT.write_text("".join(json.dumps(case, ensure_ascii=False) + "\n" for case in cases))
    agree = sum(c["math_verify"] == c["expected"] for c in cases)
    print(f"{len(cases)} cases written to {OUT}; math-verify gives the expected verdict on {agree}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
