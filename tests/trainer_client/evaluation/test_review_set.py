"""The fixed review set: two policies crossed on the same problems. Its diagonal reproduces each
policy's own evaluation exactly, and a crossed cell has the row's answers and the column's
verdicts (real tiny model and a perturbed copy, real episodes)."""

from __future__ import annotations

import copy
from contextlib import nullcontext

import torch

from env_server.debate.problems import load_problem_source
from env_server.protocol.markers import Role
from trainer_client.evaluation.episode_eval import evaluate_episodes
from trainer_client.evaluation.heldout import heldout_seeds
from trainer_client.evaluation.review_set import RolePlayers, fixed_review_set

FIGURES = ("balanced_verdict_accuracy", "verdict_accuracy_right", "verdict_accuracy_wrong", "missing_verdict_share",
           "first_answer_accuracy")


def test_the_diagonal_is_each_policys_own_evaluation_and_a_crossed_cell_mixes_them(tiny_learning_dir) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = AutoModelForCausalLM.from_pretrained(tiny_learning_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_learning_dir)
    trained = copy.deepcopy(start)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in trained.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.02)
    source, seeds = load_problem_source("gen:single_digit_sum"), heldout_seeds(12, start=720_000)
    players = {role: (trained, nullcontext) for role in Role}
    review = fixed_review_set((start, nullcontext), players, tokenizer, source, seeds, batch_size=12)
    own = {name: evaluate_episodes(model, tokenizer, source, seeds, batch_size=12)
           for name, model in (("start", start), ("trained", trained))}
    for name in ("start", "trained"):  # the judge is the trained one's: verdicts and first answers do not depend on it
        assert review[f"{name}_answers/{name}_verifier"] == {key: getattr(own[name], key) for key in FIGURES}
    for solver in ("start", "trained"):  # a row's answers are its solver's, whoever reviews them
        for verifier in ("start", "trained"):
            assert review[f"{solver}_answers/{verifier}_verifier"]["first_answer_accuracy"] == \
                own[solver].first_answer_accuracy
    # a crossed cell: the start's answers, the trained verifier's turns (transcripts: each turn by its player)
    crossed: list[dict] = []
    mixed = RolePlayers({Role.SOLVER: (start, nullcontext), Role.VERIFIER: (trained, nullcontext),
                         Role.JUDGE: (trained, nullcontext)})
    evaluate_episodes(mixed, tokenizer, source, seeds, batch_size=12, play_as=mixed.play_as, transcripts=crossed)
    alone: list[dict] = []
    evaluate_episodes(start, tokenizer, source, seeds, batch_size=12, transcripts=alone)
    solver_turns = [[t["generated"] for t in d["turns"] if t["role"] == "solver"] for d in crossed]
    assert solver_turns == [[t["generated"] for t in d["turns"] if t["role"] == "solver"] for d in alone]
    verifier_turns = [[t["generated"] for t in d["turns"] if t["role"] == "verifier"] for d in crossed]
    assert verifier_turns != [[t["generated"] for t in d["turns"] if t["role"] == "verifier"] for d in alone]
