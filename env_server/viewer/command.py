"""``mathdebate view TRAJECTORIES.jsonl``: the debate viewer (``/ui``) offline, on a file.

The file is the server's ``--trajectory-log`` (one line per graded episode: ``episode_id``,
``problem_id``, ``turns`` with ``t``/``role``/``round``/``content``, ``rewards``: the record) or
the ``trajectories.jsonl`` of ``mathdebate eval`` (the same plus ``problem``, ``gold``, ``mode``
and per-turn ``policy``). It serves ``/ui`` and its assets, ``/episodes``,
``/episodes/{episode_id}`` and ``/hints``, with the live server's shapes; there is no
``/stats`` (the page hides its live panel) and no ``state(t)`` replay (``max_t`` is null, so the
page hides its observation stepper). A line without the problem statement takes it from
``--problems`` or the built-in generator (``gen/...`` ids); lines that do not parse, or whose
record is not a valid rewards record, are skipped and counted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from env_server.jsonio import read_jsonl
from env_server.protocol.errors import UnknownEpisodeError
from env_server.protocol.markers import Role
from env_server.protocol.models import EpisodeRewards
from env_server.usage import UsageError, reading, require_free_port

if TYPE_CHECKING:
    from fastapi import FastAPI

    from env_server.debate.problems import Problem, ProblemSource

__all__ = ["TrajectoryFile", "add_view_command", "cmd_view", "create_view_app"]


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


class TrajectoryFile:
    """The episodes of a trajectory file, newest first, as an ``routes_ui.EpisodeSource``.

    Args:
        path: the JSONL file.
        problems: where to find the statement (and reference answer) of a line that lacks
            them; ``None``: the built-in generator (every family).

    Raises:
        OSError: the file cannot be read.

    Attributes:
        skipped: lines that were not valid episode lines (1-based line numbers).
    """

    def __init__(self, path: str | Path, problems: ProblemSource | None = None) -> None:
        self.path = Path(path)
        self._problems = problems
        self._episodes: dict[str, dict[str, Any]] = {}
        self.skipped: list[int] = []
        for n, line in read_jsonl(self.path, on_bad_line=lambda error: self.skipped.append(error.line)):
            try:
                rewards = line.get("rewards")
                record = None if rewards is None else EpisodeRewards.model_validate(rewards).model_dump(mode="json")
                turns = [{"t": int(turn["t"]), "role": Role(turn["role"]).value, "round": int(turn["round"]),
                          "content": str(turn["content"]), "policy": _text(turn.get("policy"))}
                         for turn in line["turns"]]
                episode = {"episode_id": str(line["episode_id"]), "problem_id": str(line["problem_id"]),
                           "problem": _text(line.get("problem")), "gold": _text(line.get("gold")),
                           "mode": line.get("mode"), "turns": turns, "rewards": record}
            except (ValueError, KeyError, TypeError, AttributeError):  # a foreign line (torn ones: on_bad_line)
                self.skipped.append(n)
                continue
            self._episodes.pop(episode["episode_id"], None)  # a repeated id: the last line wins
            self._episodes[episode["episode_id"]] = episode
        self._order = sorted((e for e in self._episodes.values() if e["rewards"] is not None),
                             key=lambda e: e["rewards"]["graded_at"], reverse=True)

    def __len__(self) -> int:
        return len(self._episodes)

    def recent_episodes(self, *, problem_id: str | None = None, error_kind: str | None = None,
                        min_reward: float | None = None, max_reward: float | None = None,
                        limit: int = 50) -> list[dict[str, Any]]:
        """Summaries of the file's graded episodes, most recently graded first, that pass every
        filter given (the semantics of ``DebateService.recent_episodes``)."""
        found: list[dict[str, Any]] = []
        for episode in self._order:
            if len(found) >= limit:
                break
            record = episode["rewards"]
            reward = record["episode_reward"]
            kinds = list(dict.fromkeys(turn["error_kind"] for turn in record["turns"] if turn["error_kind"]))
            if ((problem_id is not None and episode["problem_id"] != problem_id)
                    or (min_reward is not None and reward < min_reward)
                    or (max_reward is not None and reward > max_reward)
                    or (error_kind is not None and error_kind not in kinds)):
                continue
            found.append({"episode_id": episode["episode_id"], "problem_id": episode["problem_id"],
                          "mode": self._mode(episode), "episode_reward": reward, "error_kinds": kinds,
                          "turns": len(episode["turns"]), "graded_at": record["graded_at"]})
        return found

    def episode_view(self, episode_id: str) -> dict[str, Any]:
        """One episode of the file in full (``routes_ui.EpisodeView`` fields; ``max_t`` null).

        Raises:
            UnknownEpisodeError: no line has this episode id.
        """
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise UnknownEpisodeError(f"episode {episode_id!r} is not in {self.path.name}", episode_id=episode_id)
        problem = self._problem(episode["problem_id"]) if episode["problem"] is None or episode["gold"] is None else None
        return {
            "episode_id": episode["episode_id"],
            "problem_id": episode["problem_id"],
            "problem": episode["problem"] if episode["problem"] is not None else (problem.problem if problem else None),
            "gold": episode["gold"] if episode["gold"] is not None else (problem.answer if problem else None),
            "mode": self._mode(episode),
            "max_rounds": None,
            "done": True,
            "graded": episode["rewards"] is not None,
            "turns": episode["turns"],
            "rewards": episode["rewards"],
            "max_t": None,
        }

    @staticmethod
    def _mode(episode: dict[str, Any]) -> str:
        """The line's ``mode``, else inferred: a single-mode record has ``verifier_accepted``
        null; without a record, one solver turn alone."""
        if episode["mode"] in ("debate", "single"):
            return str(episode["mode"])
        record = episode["rewards"]
        if record is not None:
            return "single" if record["facts"]["verifier_accepted"] is None else "debate"
        return "single" if [turn["role"] for turn in episode["turns"]] == ["solver"] else "debate"

    def _problem(self, problem_id: str) -> Problem | None:
        from env_server.debate.problems import find_problem

        return find_problem(problem_id, [] if self._problems is None else [self._problems])


def create_view_app(trajectories: TrajectoryFile) -> FastAPI:
    """The viewer app over ``trajectories``: ``/ui`` (and assets), ``/episodes``,
    ``/episodes/{episode_id}`` and ``/hints``; no auth (it binds to 127.0.0.1 by default)."""
    from fastapi import FastAPI

    import env_server
    from env_server.protocol.markers import HINT_TEMPLATES
    from env_server.viewer.routes import episodes_router, ui_router

    app = FastAPI(title=f"mathdebate view: {trajectories.path.name}", version=env_server.__version__,
                  description="The debate viewer on a trajectory file (mathdebate view).")

    @app.get("/hints", tags=["Viewer"])
    async def hints() -> dict[str, str]:
        """Hint templates, ``"<role>/<error_kind>"`` -> text (RFC 0002)."""
        return HINT_TEMPLATES

    app.include_router(episodes_router(trajectories))
    app.include_router(ui_router())
    return app


def cmd_view(args: argparse.Namespace) -> int:
    """Serve the viewer on ``args.trajectories`` until interrupted."""
    import uvicorn

    from env_server.debate.problems import load_problem_source

    require_free_port(args.host, args.port)
    with reading("--problems", "pass the problems file the trajectories were played on"):
        problems = load_problem_source(args.problems) if args.problems else None
    with reading("trajectories", "pass a trajectories JSONL written by `mathdebate serve --trajectory-log` or "
                 "`mathdebate eval`"):
        trajectories = TrajectoryFile(args.trajectories, problems)
    if not len(trajectories) and trajectories.skipped:
        raise UsageError(f"no episode in {trajectories.path}: all {len(trajectories.skipped)} lines are malformed (line "
                         f"{trajectories.skipped[0]} the first); pass a trajectories JSONL written by `mathdebate serve "
                         "--trajectory-log` or `mathdebate eval`")
    skipped = f", {len(trajectories.skipped)} lines skipped" if trajectories.skipped else ""
    print(f"mathdebate view: {len(trajectories)} episodes from {trajectories.path}{skipped}; "
          f"open http://{args.host}:{args.port}/ui", file=sys.stderr)
    uvicorn.run(create_view_app(trajectories), host=args.host, port=args.port, log_level=args.log_level)
    return 0


def add_view_command(sub: Any) -> None:
    """Add ``view`` to the ``mathdebate`` subcommands (``sub``: argparse's subparsers action)."""
    view = sub.add_parser("view", help="serve the debate viewer (/ui) on a trajectory or eval JSONL file")
    view.add_argument("trajectories", help="the server's --trajectory-log JSONL, or trajectories.jsonl of mathdebate eval")
    view.add_argument("--host", default="127.0.0.1", help="bind address")
    view.add_argument("--port", type=int, default=8001)
    view.add_argument("--problems", default=None,
                      help="problem source for lines without the problem statement (as for serve; default: the "
                           "built-in generator, for gen/... ids)")
    view.add_argument("--log-level", default="warning")
    view.set_defaults(func=cmd_view)
