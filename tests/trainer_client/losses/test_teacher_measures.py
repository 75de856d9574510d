"""What the teacher pool measures (teacher accuracy, agreement, pair precision), the pair
store's held-out share and age filter, RPO's NLL term, and the tiny models' default teachers."""

from __future__ import annotations

import random

import pytest
import torch

from env_server.debate.problems import ProblemGenerator
from env_server.protocol.markers import Role
from trainer_client.config import TINY_MODELS, load_config, tiny_model_teachers
from trainer_client.losses.functional import chosen_nll
from trainer_client.losses.pair_store import DpoPair, PairStore, is_heldout_pair
from trainer_client.losses.teachers import ReplayRequest, Teacher, TeacherConfig, TeacherPool, TeacherReply

GENERATOR = ProblemGenerator(families=["two_digit_sum"])


class FixedOffsetTeacher(Teacher):
    """Answers every solver step with the reference answer plus ``offset`` (0: always right)."""

    def __init__(self, name: str, offset: int) -> None:
        super().__init__(TeacherConfig(name=name, kind="hf", model="unused"))
        self.offset = offset

    def respond(self, messages: list[dict[str, str]], problem_id: str) -> TeacherReply:
        answer = int(GENERATOR.get(problem_id).answer) + self.offset
        return TeacherReply(f"So \\boxed{{{answer}}}")


def request(seed: int, student: str) -> ReplayRequest:
    problem = GENERATOR.by_seed(seed)
    return ReplayRequest(episode_id=f"e{seed}", t=0, role=Role.SOLVER, problem_id=problem.problem_id,
                         messages=[{"role": "user", "content": problem.problem}],
                         student_response=f"\\boxed{{{student}}}", student_answer=student)


def run_pool(teachers: list[Teacher], requests: list[ReplayRequest]) -> tuple[dict[str, float], list[DpoPair]]:
    pool = TeacherPool(teachers, equivalent=lambda a, b: a == b, budget_per_step=100, measure_against=GENERATOR)
    try:
        pool.submit_step(0, requests)
        pool.wait(timeout_s=30)
        return pool.counters(), pool.collect()
    finally:
        pool.close()


def test_pool_measures_teacher_accuracy_agreement_and_pair_precision() -> None:
    # two right teachers and one that is always off by 10; the student is wrong on seeds 0-2, right on 3
    teachers = [FixedOffsetTeacher("right-a", 0), FixedOffsetTeacher("right-b", 0), FixedOffsetTeacher("off", 10)]
    requests = [request(seed, "1") for seed in range(3)] + [request(3, GENERATOR.by_seed(3).answer)]
    counters, pairs = run_pool(teachers, requests)
    assert counters["teachers/right-a/accuracy"] == 1.0 and counters["teachers/off/accuracy"] == 0.0
    assert counters["teachers/agreement"] == 1.0  # the two right ones always agree
    assert len(pairs) == 3 and counters["pairs/precision"] == 1.0  # no pair where the student was right
    assert not any(p.gold_supervised for p in pairs)  # no oracle among them

    # two teachers wrong the same way outvote a right one: every pair teaches a wrong answer
    wrong_pair = [FixedOffsetTeacher("off-a", 10), FixedOffsetTeacher("off-b", 10), FixedOffsetTeacher("right", 0)]
    counters, pairs = run_pool(wrong_pair, [request(seed, "1") for seed in range(4)])
    assert len(pairs) == 4 and counters["pairs/precision"] == 0.0
    assert counters["teachers/right/accuracy"] == 1.0 and counters["teachers/off-a/accuracy"] == 0.0

    # teachers that never agree: no pair, agreement 0
    split = [FixedOffsetTeacher("a", 1), FixedOffsetTeacher("b", 2)]
    counters, pairs = run_pool(split, [request(seed, "1") for seed in range(2)])
    assert pairs == [] and counters["teachers/agreement"] == 0.0 and "pairs/precision" not in counters


def pair(i: int, step: int) -> DpoPair:
    return DpoPair(prompt_messages=[], chosen="c", rejected="r", episode_id=f"ep{i}", t=0, role="solver", teacher="t",
                   created_step=step, context_ids=[1, i], chosen_ids=[2], rejected_ids=[3], ref_chosen_logp=-1.0,
                   ref_rejected_logp=-1.0)


def test_pair_store_keeps_a_heldout_share_out_of_training_and_filters_by_age(tmp_path) -> None:
    store = PairStore(tmp_path / "pairs.jsonl")
    pairs = [pair(i, step=i // 10) for i in range(200)]
    store.add(pairs)
    heldout = {p.episode_id for p in pairs if is_heldout_pair(p, 0.1)}
    assert 8 <= len(heldout) <= 35  # about a tenth, by hash
    assert heldout == {p.episode_id for p in pairs if is_heldout_pair(p, 0.1)}  # deterministic
    # by content: another run's episode ids do not move a pair, its tokens do
    assert heldout == {p.episode_id for p in pairs if is_heldout_pair(p.model_copy(update={"episode_id": "x"}), 0.1)}
    assert heldout != {p.episode_id for p in pairs if is_heldout_pair(p.model_copy(update={"rejected_ids": [4]}), 0.1)}
    sampled = store.sample(500, random.Random(0), heldout_share=0.1)
    assert len(sampled) == 200 - len(heldout) and not heldout & {p.episode_id for p in sampled}
    assert {p.episode_id for p in store.heldout(500, 0.1)} == heldout
    recent = store.sample(500, random.Random(0), min_step=15, heldout_share=0.1)
    assert recent and all(p.created_step >= 15 for p in recent)
    assert len(store.sample(500, random.Random(0))) == 200  # share 0: every pair trains


def test_chosen_nll_is_rpo_length_normalised_nll() -> None:
    # two pairs: -6 nats over 3 tokens (2 per token), -2 nats over 4 tokens (0.5 per token)
    value = chosen_nll(torch.tensor([-6.0, -2.0]), torch.tensor([3.0, 4.0]))
    assert value.item() == pytest.approx((2.0 + 0.5) / 2)


@pytest.mark.parametrize("model", sorted(TINY_MODELS))
def test_tiny_models_default_teachers_are_never_oracles(model) -> None:
    """A tiny model's default pool (replay on, no teachers configured) holds models that can be
    wrong: local copies of its recipe with other seeds, in the tool layout; never an oracle."""
    config = load_config(None, "full", {"model": model, "max_steps": 2})
    assert len(config.replay.teachers) >= 2
    for teacher in config.replay.teachers:
        assert teacher.kind != "oracle", f"{model}: default teacher {teacher.name} is an oracle"
        assert teacher.kind == "hf" and teacher.layout == "tools" and teacher.model.startswith(f"{model}@")
    assert not config.gold_supervised
    assert [t.model_dump(include={"name", "kind"}) for t in config.replay.teachers] == [
        {"name": t["name"], "kind": t["kind"]} for t in tiny_model_teachers(model)]


def test_a_default_teacher_is_its_policys_recipe_with_another_seed_and_its_overrides() -> None:
    from trainer_client.tiny_models.recipes import TEACHER_WARMUP_FACTOR, learning_spec, sums_spec, teacher_spec

    policy, teacher = sums_spec(), teacher_spec("tiny-sums", 2)
    # half as long again: the recipe stops mid-rise (tiny-sums@1 at the policy's length: 4% greedy)
    assert teacher["seed"] == 2 and teacher["sft_steps"] == int(policy["sft_steps"] * TEACHER_WARMUP_FACTOR)
    different = {k for k in policy if policy[k] != teacher[k]}
    # the same data recipe: warm-up split only
    assert different == {"seed", "answer_accuracy", "sft_steps", "sft_schedule_steps"}
    assert teacher["answer_accuracy"] > policy["answer_accuracy"]  # it keeps the carry more often
    assert teacher["family"] == "two_digit_sum" and teacher["warmup_seed_base"] == policy["warmup_seed_base"]
    learning, its_teacher = learning_spec(), teacher_spec("tiny-learning", 1)
    assert its_teacher["sft_steps"] == int(learning["sft_steps"] * TEACHER_WARMUP_FACTOR)
