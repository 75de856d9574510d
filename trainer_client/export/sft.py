"""The SFT dataset: one row per role turn, its ``messages`` the chat that role saw before the
turn (the server's role chat, :mod:`env_server.debate.prompts`, rebuilt from the transcript
exactly as ``DebateEpisode`` builds each observation's ``messages``) followed by the turn itself
as the ``assistant`` message.

One row per turn rather than per role conversation: each turn carries its own reward and
error-site marker, so a user keeps the turns worth imitating with one ``filter`` (e.g.
``reward == 1``), and the last message of every row is the one turn the row is about. In a
revision chat the earlier ``assistant`` messages are the role's own earlier turns of the
episode (each also a row of its own), as the role saw them.
"""

from __future__ import annotations

from typing import Any

from datasets import Features, List, Value

from env_server.debate import prompts
from env_server.protocol.markers import EpisodeMode, Role
from trainer_client.export.errors import MalformedLineError
from trainer_client.export.lines import EpisodeLine, TurnLine

__all__ = ["SFT_FEATURES", "policy_gold_supervised", "role_chat", "sft_rows"]

MESSAGES = List({"role": Value("string"), "content": Value("string")})

#: The SFT rows' columns (TRL's ``SFTTrainer`` reads ``messages``; the others are for filtering).
SFT_FEATURES = Features({
    "messages": MESSAGES,
    "episode_id": Value("string"),
    "problem_id": Value("string"),
    "mode": Value("string"),
    "t": Value("int32"),
    "role": Value("string"),
    "round": Value("int32"),
    "reward": Value("float64"),
    "correct": Value("bool"),
    "error_kind": Value("string"),
    "hint_template_key": Value("string"),
    "hint": Value("string"),
    "episode_reward": Value("float64"),
    "policy": Value("string"),
    "gold_supervised": Value("bool"),
    "source": Value("string"),
})


def policy_gold_supervised(policy: str | None) -> bool | None:
    """Whether a turn's author read the reference solution: ``scripted:`` policies of
    ``mathdebate eval`` are oracles (``True``); any other named policy ``False``; ``None`` when the
    line does not say (a server trajectory log records no author)."""
    if policy is None:
        return None
    return policy.startswith("scripted:")


def role_chat(problem: str, mode: EpisodeMode, turns: tuple[TurnLine, ...], t: int) -> list[dict[str, str]]:
    """The chat the role of turn ``t`` saw: the observation's ``messages`` after turns ``0..t-1``.

    Args:
        problem: the problem statement.
        mode: the episode's mode (``single``: the one solver prompt).
        turns: the episode's transcript.
        t: the turn.

    Raises:
        ValueError: the turns before ``t`` are not a possible debate for ``turns[t].role``.
    """
    role, before = turns[t].role, turns[:t]
    if mode is EpisodeMode.SINGLE:
        return prompts.single_solver_messages(problem)
    solver = [x.content for x in before if x.role is Role.SOLVER]
    reviews = [x.content for x in before if x.role is Role.VERIFIER]
    if role is Role.SOLVER:
        return prompts.solver_messages(problem, solver, reviews)
    if role is Role.VERIFIER:
        if not solver:
            raise ValueError("a verifier turn before any solver turn")
        return prompts.verifier_messages(problem, solver, reviews)
    return prompts.judge_messages(problem, [(x.role, x.round, x.content) for x in before])


def sft_rows(episode: EpisodeLine, problem: str, source: str) -> list[dict[str, Any]]:
    """The episode's SFT rows (one per turn, see the module docstring).

    Args:
        episode: a validated episode.
        problem: its problem statement.
        source: the file it came from (the ``source`` column).

    Raises:
        MalformedLineError: its turns are not a possible debate (e.g. a solver revising without a review).
    """
    rows = []
    for turn, reward in zip(episode.turns, episode.record.turns, strict=True):
        try:
            chat = role_chat(problem, episode.record.mode, episode.turns, turn.t)
        except ValueError as exc:
            raise MalformedLineError(episode.path, episode.line, f"turn {turn.t}: {exc}") from None
        rows.append({
            "messages": [*chat, {"role": "assistant", "content": turn.content}],
            "episode_id": episode.episode_id, "problem_id": episode.problem_id, "mode": episode.record.mode.value,
            "t": turn.t, "role": turn.role.value, "round": turn.round, "reward": reward.reward, "correct": reward.correct,
            "error_kind": reward.error_kind.value if reward.error_kind else None,
            "hint_template_key": reward.hint_template_key, "hint": reward.hint,
            "episode_reward": episode.record.episode_reward,
            "policy": turn.policy, "gold_supervised": policy_gold_supervised(turn.policy), "source": source,
        })
    return rows
