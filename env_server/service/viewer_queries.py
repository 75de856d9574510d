"""The viewer's read-only queries over the episode store: recent graded episodes (filtered) and
one episode in full. Nothing here changes state."""

from __future__ import annotations

from typing import Any

import orjson

from env_server.service.episodes import EpisodeStore

__all__ = ["episode_view", "recent_episodes"]


def recent_episodes(episodes: EpisodeStore, *, problem_id: str | None = None, error_kind: str | None = None,
                    min_reward: float | None = None, max_reward: float | None = None,
                    limit: int = 50) -> list[dict[str, Any]]:
    """Summaries of the retained graded episodes, most recently graded first, that pass
    every filter given: ``problem_id`` (exact), ``error_kind`` (the final marker of some
    turn), ``min_reward <= episode_reward <= max_reward``; at most ``limit`` of them.

    A summary is ``{episode_id, problem_id, mode, episode_reward, error_kinds, turns,
    graded_at}``: ``error_kinds`` lists the distinct final markers in turn order, ``turns``
    counts the turns taken, ``graded_at`` is the record's Unix time. The cheap filters
    (problem, reward) are applied before a stored record is read; nothing is cached.
    """
    found: list[dict[str, Any]] = []
    if limit <= 0:
        return found
    for entry in episodes.graded_newest_first():
        episode, reward = entry.episode, entry.episode_reward
        if problem_id is not None and episode.problem.problem_id != problem_id:
            continue
        if reward is None or (min_reward is not None and reward < min_reward) or (
                max_reward is not None and reward > max_reward):
            continue
        assert entry.record_json is not None
        record = orjson.loads(entry.record_json)
        kinds = list(dict.fromkeys(turn["error_kind"] for turn in record["turns"] if turn["error_kind"]))
        if error_kind is not None and error_kind not in kinds:
            continue
        found.append({"episode_id": entry.episode_id, "problem_id": episode.problem.problem_id,
                      "mode": episode.mode.value, "episode_reward": reward, "error_kinds": kinds,
                      "turns": episode.step_count, "graded_at": record["graded_at"]})
        if len(found) >= limit:
            break
    return found

def episode_view(episodes: EpisodeStore, episode_id: str) -> dict[str, Any]:
    """One known episode in full, for reading: ``{episode_id, problem_id, problem, mode,
    max_rounds, done, graded, turns, rewards, max_t}`` with ``turns`` as ``{t, role, round,
    content}``, ``rewards`` the record once graded (else ``None``) and ``max_t`` the last
    observation ``state(t)`` replays (``DebateService.episode_state_at``). No reference answer.

    Raises:
        UnknownEpisodeError: never started, abandoned, or past retention.
    """
    entry = episodes.get(episode_id)
    episode = entry.episode
    return {
        "episode_id": entry.episode_id,
        "problem_id": episode.problem.problem_id,
        "problem": episode.problem.problem,
        "mode": episode.mode.value,
        "max_rounds": episode.max_rounds,
        "done": episode.done,
        "graded": entry.is_graded,
        "turns": [{"t": turn.t, "role": turn.role.value, "round": turn.round, "content": turn.content}
                  for turn in episode.turns],
        "rewards": None if entry.record_json is None else orjson.loads(entry.record_json),
        "max_t": episode.step_count - 1 if episode.done else episode.step_count,
    }
