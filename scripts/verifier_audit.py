"""Audit of the verifier of a finished run (docs/ablation/debate/audit.md): the start model and the
run's ``final/`` play greedy debates on validation problems in the training layout
(``evaluate_episodes``, the evaluation ``ablate`` and ``eval_steps`` report), and every verifier
turn is sorted out: a missing verdict (and why: a malformed tool call whose text has no verdict
line, or a verdict argument that is not CORRECT/INCORRECT), a verdict whose word is not the
argument the model gave (polarity), the answer it was graded against (the solver turn before it),
and what the judge did (copied the solver's last answer or gave its own, right or wrong) by the
first answer and the verdict.

    python scripts/verifier_audit.py RUN_DIR [--problems 200] [--out audit.json] [--examples 3]

Prints one table per model and writes the figures and sample transcripts (``--examples`` per
category) as JSON. Problems: the validation split of the run's ``problems``
(``VALIDATION_SEED_BASE + i``), never the held-out one.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

ARGUMENT = re.compile(r'"verdict"\s*:\s*"([^"]*)"')
#: The tiny models' critique (their warm-up's template): "... The sum is $S$. The solution's answer is A."
CRITIQUE = re.compile(r"The sum is \$?(-?\d+)\$?\.\s*The solution's answer is (-?\d+)")


def _category(turn: dict[str, Any], reviewed_right: bool | None) -> str:
    """Why a verifier turn's verdict is what it is: ``malformed_call``, ``bad_argument``,
    ``accept``/``reject`` (of a right or wrong answer)."""
    if turn["verdict"] is None:
        return "missing:malformed_call" if not turn["valid_call"] else "missing:bad_argument"
    said = "accept" if turn["verdict"] == "CORRECT" else "reject"
    return f"{said}:{'right' if reviewed_right else 'wrong'}_answer"


def audit(transcripts: list[dict[str, Any]], examples: int) -> dict[str, Any]:
    """Counts and sample transcripts of one model's debates."""
    from env_server.debate.answers import answer_key
    from env_server.protocol.models import EpisodeRewards
    from trainer_client.credit.verdicts import verdict_figures

    categories: Counter[str] = Counter()
    samples: dict[str, list[dict[str, Any]]] = {}
    polarity = argument_words = reviewed_not_previous = no_answer_reviewed = 0
    judge: Counter[str] = Counter()
    critique: Counter[str] = Counter()
    for debate in transcripts:
        turns = debate["turns"]
        graded = {t["t"]: t for t in debate["record"]["turns"]}
        for k, turn in enumerate(turns):
            if turn["role"] != "verifier":
                continue
            previous = next(t for t in reversed(turns[:k]) if t["role"] == "solver")
            reviewed_not_previous += previous["t"] != turn["t"] - 1
            no_answer_reviewed += previous["answer"] is None
            category = _category(turn, graded[previous["t"]]["correct"])
            categories[category] += 1
            read = CRITIQUE.search(turn["content"] or "")
            if read and turn["verdict"] is not None:  # does the verdict follow the verifier's own check?
                checked, quoted = read.group(1), read.group(2)
                critique["read"] += 1
                critique["sum_right"] += checked == debate["gold"]
                critique["quotes_the_answer"] += quoted == (previous["answer"] or "")
                critique["verdict_follows_check"] += (checked == quoted) == (turn["verdict"] == "CORRECT")
            if turn["valid_call"] and turn["generated"]:
                argument = ARGUMENT.search(turn["generated"])
                if argument:
                    word = argument.group(1).strip().upper()
                    argument_words += 1
                    polarity += word in ("CORRECT", "INCORRECT") and turn["verdict"] not in (None, word)
            if len(samples.setdefault(category, [])) < examples:
                samples[category].append({"problem": debate["problem"], "gold": debate["gold"],
                                          "reviewed_answer": previous["answer"],
                                          "verifier_generated": turn["generated"], "content": turn["content"]})
        facts = debate["record"]["facts"]
        if facts["judge_correct"] is not None:
            solver_answers = [t["answer"] for t in turns if t["role"] == "solver"]
            judge_answer = turns[-1]["answer"] if turns[-1]["role"] == "judge" else None
            verdict = "accepted" if facts["verifier_accepted"] else "rejected"
            copied = (judge_answer is not None and solver_answers[-1] is not None
                      and answer_key(judge_answer) == answer_key(solver_answers[-1]))
            first = "first_right" if facts["first_answer_correct"] else "first_wrong"
            judge[f"{first}:{verdict}:{'copied' if copied else 'own'}:"
                  f"{'right' if facts['final_answer_correct'] else 'wrong'}"] += 1
    figures = verdict_figures([EpisodeRewards.model_validate(d["record"]) for d in transcripts])
    return {"debates": len(transcripts), "figures": figures.as_dict(), "verifier_turns": dict(categories),
            "polarity_mismatches": polarity, "verdict_arguments_read": argument_words,
            "reviewed_not_the_previous_turn": reviewed_not_previous, "reviewed_without_answer": no_answer_reviewed,
            "critique": dict(critique), "judge": dict(sorted(judge.items())), "examples": samples}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--problems", type=int, default=200)
    parser.add_argument("--examples", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--sampled-k", type=int, default=4,
                        help="also the figures of this many debates per problem sampled at the run's temperature "
                             "(the verdicts training rewards; 0: none)")
    args = parser.parse_args(argv)

    from env_server.debate.problems import load_problem_source
    from trainer_client.ablation.run_policies import load_run_policies
    from trainer_client.evaluation.during_training import validation_seeds
    from trainer_client.evaluation.episode_eval import evaluate_episodes
    from trainer_client.training.train import load_model

    settings = yaml.safe_load((args.run_dir / "config.yaml").read_text())
    source = load_problem_source(settings["problems"])
    seeds = validation_seeds(args.problems)
    start_model, start_tokenizer = load_model(settings["model"], args.run_dir)
    final_model, final_tokenizer, play_as = load_run_policies(args.run_dir)
    report: dict[str, Any] = {"run_dir": str(args.run_dir), "problems": settings["problems"],
                              "validation_problems": len(seeds), "max_rounds": settings.get("max_rounds", 1)}
    for name, model, tokenizer, roles in (("start", start_model, start_tokenizer, None),
                                          ("trained", final_model, final_tokenizer, play_as)):
        transcripts: list[dict[str, Any]] = []
        evaluate_episodes(model, tokenizer, source, seeds, max_rounds=settings.get("max_rounds", 1), play_as=roles,
                          transcripts=transcripts)
        report[name] = audit(transcripts, args.examples)
        if args.sampled_k:
            sampled: list[dict[str, Any]] = []
            evaluate_episodes(model, tokenizer, source, seeds, max_rounds=settings.get("max_rounds", 1), play_as=roles,
                              k=args.sampled_k, temperature=settings.get("temperature", 1.0), transcripts=sampled)
            report[name]["sampled"] = {key: value for key, value in audit(sampled, 0).items() if key != "examples"}
            report[name]["sampled"]["temperature"] = settings.get("temperature", 1.0)
        shown = {k: v for k, v in report[name].items() if k != "examples"}
        print(f"== {name}\n{json.dumps(shown, indent=1)}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
