"""The fixed review set (issue 54): the start's and the trained solver's greedy answers to the same
problems, each reviewed by the start's and by the trained verifier.

A run's own evaluation has the trained verifier review the trained solver's answers, so a lower
balanced verdict accuracy after training can mean a worse verifier or answers that are harder to
check (a solver that learned the carry is right on the problems whose check needs it). Crossing
the two solvers with the two verifiers on the same problems separates them: the change in the
verifier at fixed answers (the same column) and the change in the answers at a fixed verifier
(the same row).

Each cell is :func:`~trainer_client.evaluation.episode_eval.evaluate_episodes`, greedy, with the
solver's turns played by one policy and the verifier's by another (:class:`RolePlayers`); the
judge is the trained run's (the verdicts do not depend on it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch

from env_server.protocol.markers import Role

__all__ = ["Player", "RolePlayers", "fixed_review_set"]

Player = tuple[torch.nn.Module, Callable[[], AbstractContextManager[Any]]]
"""A policy: a model and the context that makes it play (an adapter switch, or nothing)."""


class RolePlayers(torch.nn.Module):
    """One model object for :func:`~trainer_client.evaluation.episode_eval.evaluate_episodes`
    whose ``generate`` is the acting role's policy: ``play_as(role)`` makes ``players[role]`` the
    active one (and enters its context) while that role's turns are generated.

    Args:
        players: the policy of each role that plays.

    Raises:
        ValueError: no players.
    """

    def __init__(self, players: Mapping[Role, Player]) -> None:
        super().__init__()
        if not players:
            raise ValueError("RolePlayers needs at least one player")
        self.players = dict(players)
        models = list({id(model): model for model, _ in self.players.values()}.values())
        self.models = torch.nn.ModuleList(models)  # train(mode) reaches every player's model
        self.active: torch.nn.Module = models[0]

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """The active player's ``generate``."""
        return self.active.generate(*args, **kwargs)  # type: ignore[operator]  # a causal LM's generate

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]:
        """The active player's parameters (evaluation reads the device from the first one)."""
        return self.active.parameters(recurse)

    @contextmanager
    def play_as(self, role: Role | None) -> Iterator[None]:
        """``role``'s player active inside the block (a role without a player: the first one's model)."""
        model, enter = self.players.get(role, (self.active, nullcontext)) if role is not None else (self.active, nullcontext)
        previous, self.active = self.active, model
        try:
            with enter():
                yield
        finally:
            self.active = previous


def fixed_review_set(start: Player, trained: Mapping[Role, Player], tokenizer: Any, source: Any,
                     seeds: Sequence[int], *, max_new_tokens: int = 96, batch_size: int = 64) -> dict[str, Any]:
    """The verdict figures of the four (solver, verifier) pairs on the same problems.

    Args:
        start: the starting policy (plays the start's solver and verifier).
        trained: the trained run's policy per role (solver, verifier, judge).
        tokenizer: the tokenizer both share.
        source, seeds: the problems (validation or held-out seeds).
        max_new_tokens, batch_size: as :func:`~trainer_client.evaluation.episode_eval.evaluate_episodes`.

    Returns:
        ``{"<solver>_answers/<verifier>_verifier": figures}`` for solver and verifier each
        ``start`` or ``trained``; figures: ``balanced_verdict_accuracy``,
        ``verdict_accuracy_right``, ``verdict_accuracy_wrong``, ``missing_verdict_share``,
        ``first_answer_accuracy`` (of the answers reviewed).

    Raises:
        KeyError: ``trained`` lacks a solver, verifier or judge.
    """
    from trainer_client.evaluation.episode_eval import evaluate_episodes

    out: dict[str, Any] = {}
    for solver_name, solver in (("start", start), ("trained", trained[Role.SOLVER])):
        for verifier_name, verifier in (("start", start), ("trained", trained[Role.VERIFIER])):
            players = RolePlayers({Role.SOLVER: solver, Role.VERIFIER: verifier, Role.JUDGE: trained[Role.JUDGE]})
            report = evaluate_episodes(players, tokenizer, source, seeds, play_as=players.play_as,
                                       max_new_tokens=max_new_tokens, batch_size=batch_size)
            out[f"{solver_name}_answers/{verifier_name}_verifier"] = {
                key: getattr(report, key) for key in ("balanced_verdict_accuracy", "verdict_accuracy_right",
                                                      "verdict_accuracy_wrong", "missing_verdict_share",
                                                      "first_answer_accuracy")}
    return out
