"""The episodes dataset: one row per graded episode, with its rewards record (episode reward,
counterfactual facts, per-role local rewards) and every turn with its reward and error-site
marker (``error_kind``, ``hint_template_key``; RFC 0002)."""

from __future__ import annotations

from typing import Any

from datasets import Features, List, Value

from env_server.protocol.markers import Role
from trainer_client.export.lines import EpisodeLine
from trainer_client.export.sft import policy_gold_supervised

__all__ = ["EPISODE_FEATURES", "episode_row"]

PER_ROLE = {role.value: Value("float64") for role in Role}

#: The episode rows' columns.
EPISODE_FEATURES = Features({
    "episode_id": Value("string"),
    "problem_id": Value("string"),
    "problem": Value("string"),
    "gold": Value("string"),
    "mode": Value("string"),
    "episode_reward": Value("float64"),
    "first_answer_correct": Value("bool"),
    "last_solver_answer_correct": Value("bool"),
    "final_answer_correct": Value("bool"),
    "judge_correct": Value("bool"),
    "verifier_accepted": Value("bool"),
    "rounds": Value("int32"),
    "circular_critique": Value("bool"),
    "local_rewards": PER_ROLE,
    "rewards_without_role": PER_ROLE,
    "error_kinds": List(Value("string")),
    "error_sites": Value("int32"),
    "turns": List({
        "t": Value("int32"), "role": Value("string"), "round": Value("int32"), "content": Value("string"),
        "reward": Value("float64"), "error_kind": Value("string"), "hint_template_key": Value("string"),
        "hint": Value("string"), "answer": Value("string"), "correct": Value("bool"), "policy": Value("string"),
    }),
    "graded_at": Value("float64"),
    "chosen": Value("bool"),
    "sample": Value("int32"),
    "gold_supervised": Value("bool"),
    "source": Value("string"),
})


def episode_row(episode: EpisodeLine, problem: str | None, gold: str | None, source: str) -> dict[str, Any]:
    """The episode's row.

    Args:
        episode: a validated episode.
        problem, gold: its statement and reference answer (``None`` when unknown).
        source: the file it came from (the ``source`` column).

    Returns:
        A dict with the keys of :data:`EPISODE_FEATURES`. ``gold_supervised``: ``True`` when a
        turn's author read the reference solution (a ``scripted:`` eval policy), ``False`` when
        every turn names another policy, ``None`` when the line does not say (a server log).
    """
    record, facts = episode.record, episode.record.facts
    turns = [{"t": turn.t, "role": turn.role.value, "round": turn.round, "content": turn.content, "reward": reward.reward,
              "error_kind": reward.error_kind.value if reward.error_kind else None,
              "hint_template_key": reward.hint_template_key, "hint": reward.hint, "answer": reward.answer,
              "correct": reward.correct, "policy": turn.policy}
             for turn, reward in zip(episode.turns, record.turns, strict=True)]
    authors = [policy_gold_supervised(turn.policy) for turn in episode.turns]
    gold_supervised = None if None in authors else any(authors)
    return {
        "episode_id": episode.episode_id, "problem_id": episode.problem_id, "problem": problem, "gold": gold,
        "mode": record.mode.value, "episode_reward": record.episode_reward,
        "first_answer_correct": facts.first_answer_correct, "last_solver_answer_correct": facts.last_solver_answer_correct,
        "final_answer_correct": facts.final_answer_correct, "judge_correct": facts.judge_correct,
        "verifier_accepted": facts.verifier_accepted, "rounds": facts.rounds, "circular_critique": facts.circular_critique,
        "local_rewards": {role.value: facts.local_rewards.get(role) for role in Role},
        "rewards_without_role": {role.value: facts.rewards_without_role.get(role) for role in Role},
        "error_kinds": list(dict.fromkeys(turn["error_kind"] for turn in turns if turn["error_kind"])),
        "error_sites": sum(turn["error_kind"] is not None for turn in turns),
        "turns": turns, "graded_at": record.graded_at, "chosen": episode.chosen, "sample": episode.sample,
        "gold_supervised": gold_supervised, "source": source,
    }
