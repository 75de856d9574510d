"""Reading graded episodes from JSONL: the server's ``--trajectory-log`` and the
``trajectories.jsonl`` of ``mathdebate eval`` (the same line schema plus ``problem``, ``gold``,
``chosen``, ``sample`` and per-turn ``policy``).

Strict where the viewer is lenient (``mathdebate view`` skips bad lines): a line that is not
JSON, lacks a field, carries a rewards record that does not validate, or whose turns do not match
its record is a :class:`~trainer_client.export.errors.MalformedLineError` with its line number.
Lines whose ``rewards`` is null (an eval episode that failed before grading) are counted, not
exported; a repeated episode id keeps its last line (as the viewer does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from env_server.jsonio import JSONLineError, read_jsonl
from env_server.protocol.markers import Role
from env_server.protocol.models import EpisodeRewards
from trainer_client.export.errors import EmptySourceError, MalformedLineError

__all__ = ["EpisodeFile", "EpisodeLine", "TurnLine", "read_episode_lines"]


@dataclass(frozen=True)
class TurnLine:
    """One turn of a line: who said what (``policy``: the eval policy spec, ``None`` in a server log)."""

    t: int
    role: Role
    round: int
    content: str
    policy: str | None = None


@dataclass(frozen=True)
class EpisodeLine:
    """One graded episode of a JSONL file.

    Attributes:
        path, line: where it was read (1-based line number).
        episode_id, problem_id: the episode and its problem.
        problem, gold: the statement and reference answer when the line carries them (eval), else ``None``.
        turns: the transcript, ordered by ``t`` (``t == index``).
        record: the validated rewards record; ``record.turns[i]`` is the reward of ``turns[i]``.
        chosen, sample: eval only: whether the strategy chose this episode, and its sample index.
    """

    path: Path
    line: int
    episode_id: str
    problem_id: str
    problem: str | None
    gold: str | None
    turns: tuple[TurnLine, ...]
    record: EpisodeRewards
    chosen: bool | None = None
    sample: int | None = None


@dataclass
class EpisodeFile:
    """The episodes of one file and what was left out.

    Attributes:
        path: the file.
        episodes: the graded episodes, in file order (a repeated id at its last line).
        lines: non-blank lines read.
        ungraded: lines whose ``rewards`` is null (not exported).
        repeated: lines replaced by a later line with the same episode id.
    """

    path: Path
    episodes: list[EpisodeLine] = field(default_factory=list)
    lines: int = 0
    ungraded: int = 0
    repeated: int = 0


def _optional_text(value: Any, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ValueError(f"{name!r} is not a string")


def _turns(raw: Any) -> tuple[TurnLine, ...]:
    if not isinstance(raw, list) or not raw:
        raise ValueError("'turns' is not a non-empty list")
    turns = []
    for i, turn in enumerate(raw):
        if not isinstance(turn, dict) or not isinstance(turn.get("content"), str):
            raise ValueError(f"turn {i} has no text 'content'")
        t, rnd = turn.get("t"), turn.get("round")
        if t != i or not isinstance(rnd, int) or isinstance(rnd, bool) or rnd < 0:
            raise ValueError(f"turn {i} has t={t!r}, round={rnd!r} (expected t={i} and a round >= 0)")
        turns.append(TurnLine(t=i, role=Role(turn.get("role")), round=rnd, content=turn["content"],
                              policy=_optional_text(turn.get("policy"), "policy")))
    return tuple(turns)


def _episode(path: Path, n: int, data: Any) -> EpisodeLine | None:
    """The episode of line ``n`` (``None``: ungraded). Raises ``ValueError``/``KeyError``/``ValidationError``."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    for key in ("episode_id", "problem_id", "turns", "rewards"):
        if key not in data:
            raise KeyError(key)
    if data["rewards"] is None:
        return None
    record = EpisodeRewards.model_validate(data["rewards"])
    turns = _turns(data["turns"])
    if [(r.t, r.role) for r in record.turns] != [(t.t, t.role) for t in turns]:
        raise ValueError("the turns and the rewards record's turns differ (t, role)")
    if record.episode_id != data["episode_id"] or record.problem_id != data["problem_id"]:
        raise ValueError("episode_id/problem_id differ from the rewards record's")
    chosen, sample = data.get("chosen"), data.get("sample")
    return EpisodeLine(path=path, line=n, episode_id=str(data["episode_id"]), problem_id=str(data["problem_id"]),
                       problem=_optional_text(data.get("problem"), "problem"), gold=_optional_text(data.get("gold"), "gold"),
                       turns=turns, record=record, chosen=chosen if isinstance(chosen, bool) else None,
                       sample=sample if isinstance(sample, int) and not isinstance(sample, bool) else None)


def read_episode_lines(path: str | Path) -> EpisodeFile:
    """Read and validate every line of a trajectory JSONL file.

    Args:
        path: a server ``--trajectory-log`` or an eval ``trajectories.jsonl``.

    Returns:
        The file's graded episodes and counts of what was left out.

    Raises:
        EmptySourceError: the file has no non-blank line, or no graded episode.
        MalformedLineError: a line is not valid (its 1-based number and why).
        OSError: the file cannot be read.
    """
    path = Path(path)
    found = EpisodeFile(path)
    by_id: dict[str, EpisodeLine] = {}

    def malformed(error: JSONLineError) -> None:
        raise MalformedLineError(path, error.line, error.reason)

    for n, value in read_jsonl(path, on_bad_line=malformed):
        found.lines += 1
        try:
            episode = _episode(path, n, value)
        except KeyError as exc:
            raise MalformedLineError(path, n, f"no {exc.args[0]!r} field") from None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise MalformedLineError(path, n, f"invalid rewards record: {where}: {first['msg']}") from None
        except (ValueError, TypeError) as exc:
            raise MalformedLineError(path, n, str(exc)) from None
        if episode is None:
            found.ungraded += 1
            continue
        if episode.episode_id in by_id:
            found.repeated += 1
            del by_id[episode.episode_id]
        by_id[episode.episode_id] = episode
    if not found.lines:
        raise EmptySourceError(path, "no lines: nothing to export (was the server given --trajectory-log and did any "
                                     "episode finish grading?)")
    found.episodes = list(by_id.values())
    if not found.episodes:
        raise EmptySourceError(path, f"{found.ungraded} line(s), none graded (every 'rewards' is null)")
    return found
