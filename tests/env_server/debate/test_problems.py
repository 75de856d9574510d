"""Problem sources: the generator's determinism and exact answers, the JSONL and HF loaders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from env_server.debate.answers import last_boxed
from env_server.debate.problems import (
    JsonlProblems,
    ProblemGenerator,
    UnknownProblemError,
    load_problem_source,
)
from env_server.debate.problems.generator import FAMILIES, latex_number, polynomial
from env_server.debate.problems.hf import problems_from_dataset
from env_server.grading.worker import grade_answer


def test_generator_is_deterministic_and_ids_round_trip() -> None:
    a, b = ProblemGenerator(), ProblemGenerator()
    for seed in range(400):
        problem = a.by_seed(seed)
        assert problem == b.by_seed(seed)
        assert a.get(problem.problem_id) == problem
        family = problem.problem_id.split("/")[1]
        assert family == list(FAMILIES)[seed % len(FAMILIES)] and problem.subject == family
    assert {a.by_seed(s).subject for s in range(len(FAMILIES))} == set(FAMILIES)


@pytest.mark.parametrize("bad", ["gen/nope/1", "gen/gcd_lcm/x", "test/algebra/1.json", "gen/gcd_lcm", ""])
def test_generator_rejects_malformed_ids(bad: str) -> None:
    with pytest.raises(UnknownProblemError):
        ProblemGenerator().get(bad)


def test_generator_family_restriction() -> None:
    only = ProblemGenerator(["gcd_lcm"])
    assert {only.by_seed(s).subject for s in range(20)} == {"gcd_lcm"}
    with pytest.raises(ValueError, match="available"):
        ProblemGenerator(["calculus_of_variations"])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_generated_solutions_are_graded_correct_and_variants_wrong(family: str) -> None:
    generator = ProblemGenerator([family])
    for seed in range(60):
        problem = generator.by_seed(seed)
        assert last_boxed(problem.solution) == problem.answer
        assert grade_answer(problem.answer, problem.answer) == (True, None)
        wrong = f"{problem.answer} + 1" if "\\{" not in problem.answer else r"\{-1000\}"
        assert grade_answer(problem.answer, wrong)[0] is False, (problem.problem_id, wrong)
        assert "\\boxed" not in problem.problem


def test_latex_helpers() -> None:
    from fractions import Fraction

    assert latex_number(Fraction(-3, 4)) == r"-\frac{3}{4}"
    assert latex_number(Fraction(6, 3)) == "2"
    assert polynomial([2, 0, -3, 1]) == "2x^3 - 3x + 1"
    assert polynomial([-1, 1, 0]) == "-x^2 + x"
    assert polynomial([0, 0]) == "0"


def test_math500_loader(math500_path: Path) -> None:
    problems = load_problem_source(str(math500_path))
    assert len(problems) == 500 and len(set(problems.ids())) == 500
    first = problems.get("test/precalculus/807.json")
    assert first.answer == r"\left( 3, \frac{\pi}{2} \right)" and first.level == 2 and first.subject == "Precalculus"
    assert problems.by_seed(0) == first and problems.by_seed(500) == first
    with pytest.raises(UnknownProblemError):
        problems.get("test/precalculus/nope.json")


def test_gsm8k_loader(gsm8k_path: Path) -> None:
    problems = load_problem_source(str(gsm8k_path))
    assert len(problems) == 1319
    first = problems.get("gsm8k/0")
    assert first.answer == "18" and first.problem.startswith("Janet")
    assert all("<<" not in p.solution and last_boxed(p.solution) == p.answer for p in problems)


def write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_gsm8k_thousands_separators(tmp_path: Path) -> None:
    path = write(tmp_path, "g.jsonl", [json.dumps({"question": "q?", "answer": "3*<<3*1000=3000>>3000\n#### 3,000"})])
    problem = JsonlProblems.from_path(path).get("gsm8k/0")
    assert problem.answer == "3000" and "<<" not in problem.solution


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"problem": "p", "answer": "1", "unique_id": "a"}', "{oops"], ":2:"),
        (['{"problem": "p", "answer": "1"}'], "unique_id"),
        (['{"question": "q", "answer": "no marker"}'], "####"),
        (['{"text": "hello"}'], "unrecognised"),
        (['{"problem": "p", "answer": "1", "unique_id": "a"}'] * 2, "duplicate"),
        (["", "  "], "no problems"),
    ],
)
def test_loader_errors_name_the_problem(tmp_path: Path, lines: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        JsonlProblems.from_path(write(tmp_path, "bad.jsonl", lines))


def test_missing_file() -> None:
    with pytest.raises(FileNotFoundError):
        load_problem_source("/nonexistent/problems.jsonl")


def test_hf_loader_offline(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = [{"problem": "1+1?", "answer": "2"}, {"problem": "2+2?", "answer": "4"}]
    in_memory = problems_from_dataset(datasets.Dataset.from_list(rows), name="tiny")
    assert in_memory.get("tiny/1").answer == "4"
    path = write(tmp_path, "gsm.jsonl", [json.dumps({"question": "q", "answer": "x\n#### 7"})])
    loaded = problems_from_dataset(datasets.load_dataset("json", data_files=str(path), split="train"), name="local")
    assert loaded.get("gsm8k/0").answer == "7"


def test_two_digit_sum_splits_are_disjoint_by_content() -> None:
    """RL, warm-up, validation and held-out problems of ``two_digit_sum`` never share a problem
    text (nor a problem with its commuted twin); each split's seeds draw only from its own list,
    and there are thousands of distinct problems."""
    from env_server.debate.problems.splits import (
        HELDOUT_SEED_BASE,
        VALIDATION_SEED_BASE,
        WARMUP_SEED_BASE,
        split_of_seed,
        two_digit_pairs,
    )

    pairs = two_digit_pairs()
    assert sum(len(v) for v in pairs.values()) == 90 * 90
    unordered = {split: {frozenset(p) if p[0] != p[1] else frozenset([p[0]]) for p in v} for split, v in pairs.items()}
    splits = list(unordered)
    for i, a in enumerate(splits):
        for b in splits[i + 1:]:
            assert not unordered[a] & unordered[b], (a, b)
    assert min(len(v) for v in pairs.values()) > 1000  # at least a thousand ordered problems per split

    source = ProblemGenerator(families=["two_digit_sum"])
    drawn: dict[str, set[str]] = {}
    for split, base, n in (("rl", 0, 3000), ("warmup", WARMUP_SEED_BASE, 3000),
                           ("heldout", HELDOUT_SEED_BASE, 600), ("validation", VALIDATION_SEED_BASE, 600)):
        problems = [source.by_seed(base + i) for i in range(n)]
        assert {split_of_seed(base + i) for i in (0, n - 1)} == {split}
        assert all(int(p.answer) == sum(int(x) for x in p.problem[len("Compute $"):-2].split(" + ")) for p in problems)
        assert all(p.solution.endswith(f"\\boxed{{{p.answer}}}$.") for p in problems)
        drawn[split] = {p.problem for p in problems}
        twins = {f"Compute ${b} + {a}$." for a, b in (p.problem[len("Compute $"):-2].split(" + ") for p in problems)}
        drawn[split] |= twins
    for i, a in enumerate(drawn):
        for b in list(drawn)[i + 1:]:
            assert not drawn[a] & drawn[b], (a, b)
    assert len({source.by_seed(HELDOUT_SEED_BASE + i).problem for i in range(500)}) == 500  # no repeats in 500
    assert source.get("gen/two_digit_sum/1000000007") == source.by_seed(HELDOUT_SEED_BASE + 7)


def test_exact_division_splits_by_content_and_its_working_is_exact() -> None:
    """``exact_division``: all 720 problems ``(q·d) ÷ d`` (q 10..99, d 2..9) fall in exactly one
    split; each split's seeds draw only from its own list; every reference solution's two long
    division steps are true arithmetic and end in the boxed quotient; checking (q·d) is cheaper
    than solving in the sense the family is for: 80 one-digit products against 404 division facts."""
    import re

    from env_server.debate.problems.generator import long_division_steps
    from env_server.debate.problems.splits import SPLITS, VALIDATION_SEED_BASE, division_pairs, split_of_seed

    pairs = division_pairs()
    every = [pair for split in SPLITS for pair in pairs[split]]
    assert len(every) == len(set(every)) == 90 * 8
    assert min(len(pairs[split]) for split in SPLITS) >= 100
    source = ProblemGenerator(families=["exact_division"])
    step = re.compile(r"Tens: \$(\d+) \\div (\d) = (\d)\$ remainder \$(\d)\$\. Ones: \$(\d+) \\div \2 = (\d)\$\. ")
    for split, base in (("rl", 0), ("validation", VALIDATION_SEED_BASE)):
        n = len(pairs[split])
        problems = [source.by_seed(base + i) for i in range(n)]
        assert {split_of_seed(base + i) for i in (0, n - 1)} == {split}
        assert {p.problem for p in problems} == {f"Compute ${q * d} \\div {d}$." for q, d in pairs[split]}
        for p in problems:
            lead, d, tens, rem, part, ones = map(int, step.match(p.solution).groups())
            assert lead == tens * d + rem and rem < d and part == ones * d and int(p.answer) == 10 * tens + ones
            assert p.solution.endswith(f"\\boxed{{{p.answer}}}$.")
    facts = {(part, d) for q in range(10, 100) for d in range(2, 10) for part, _, _ in long_division_steps(q * d, d)}
    products = {(digit, d) for q in range(10, 100) for d in range(2, 10) for digit in (q // 10, q % 10)}
    assert len(facts) == 404 and len(products) == 80
    with pytest.raises(ValueError, match="exact_division divides"):
        long_division_steps(1000, 9)


def test_find_problem_reaches_every_generated_family() -> None:
    """The viewer's and the exporter's lookup: a source first, then any generated family (split
    families included), else None."""
    from env_server.debate.problems import find_problem

    split = ProblemGenerator(families=["two_digit_sum"]).by_seed(1_000_000_003)
    assert find_problem(split.problem_id) == split
    assert find_problem("gen/single_digit_sum/7") == ProblemGenerator(families=["single_digit_sum"]).by_seed(7)
    assert find_problem("gen/no_such_family/1") is None and find_problem("math500/1") is None
