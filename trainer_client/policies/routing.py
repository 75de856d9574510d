"""Role routing at run time: every turn generated, and every log-prob of its tokens computed, by
the policy of the role whose turn it is.

**Generation.** TRL's tool loop (trl 1.16) generates one round at a time for the rollouts that
are still calling tools; :meth:`RoleRouter.generate_round` gets each round's prompts, finds
their rows in the batch (:class:`~trainer_client.rollout.rows.RowTracker`), reads each row's acting role from its environment
(the observation's ``role``: the role whose turn is due), and generates each route's rows
together: under the role's adapter, under the base with adapters off (``frozen``), or through the
endpoint (:class:`~trainer_client.policies.endpoint.EndpointPlayer`). The batch is split by
route per round, so a round costs one generation call per route present.

**Scoring.** Each completion token belongs to a segment, and a segment to the turn it produced
or the turn that was due (:mod:`trainer_client.rollout.segments`): the role generation used.
:meth:`RoleRouter.token_routes` writes each token's adapter index (``-1``: no adapter);
:meth:`RoleRouter.logps` computes the per-token log-probs once per adapter, with that adapter
active over the whole sequence (a role's policy reads the whole debate), and keeps each token's
value from its own adapter's pass:

    log π(y_t | y_<t) = log π_{θ_0 + Δ_{a(t)}}(y_t | y_<t),   a(t) = the adapter of the role of token t,

so the loss of a role's tokens reaches only its adapter's parameters (``torch.where`` passes no
gradient to the other passes). Current, old and reference log-probs all come through it; the
reference is TRL's pass with adapters off, the base, which is every adapter at step 0 (LoRA's
``B`` starts at 0). Tokens of untrained roles (frozen, endpoint) are masked out of every loss
(:meth:`RoleRouter.untrained_mask`), as judge tokens always are.

Cost: ``R`` forward (and backward) passes per micro-batch for ``R`` adapters, against one for the
shared policy; under DDP every adapter's pass runs on every micro-batch (one through the DDP
wrapper, the others through the module it wraps, as the loss channels' extra passes do), so
that every trained parameter gets a gradient in each backward.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from env_server.protocol.markers import Role
from trainer_client.policies.adapters import use_route
from trainer_client.policies.endpoint import EndpointPlayer
from trainer_client.policies.settings import PoliciesConfig, Route
from trainer_client.rollout.rows import RowTracker
from trainer_client.rollout.segments import Segment

__all__ = ["ROUTES", "RoleRouter", "adapters_off"]

log = logging.getLogger(__name__)

#: The batch column holding each completion token's adapter index (``(B, T)`` long, ``-1``: none).
ROUTES = "policy_routes"


def adapters_off(model: torch.nn.Module) -> bool:
    """Whether ``model``'s adapter layers are disabled (inside PEFT's ``disable_adapter``: TRL's
    reference pass); ``False`` for a model without adapters."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return any(module.disable_adapters for module in model.modules() if isinstance(module, BaseTunerLayer))


class RoleRouter:
    """Routes generation and scoring by role (see the module docstring).

    Args:
        policies: the ``policies`` section.
        unwrap: the trainer's ``accelerator.unwrap_model`` (the PEFT model under DDP).
        endpoint: plays the endpoint roles' turns (required when a role has an endpoint).

    Attributes:
        adapter_routes: ``adapter:NAME`` per adapter; a token's route index points here.
        rounds: this batch's generation rounds, each a list of ``(row, route)`` (what played what).
        failed_rows: this batch's rows whose endpoint request failed (row -> its
            :class:`~env_server.client.failures.RequestFailure`): failed rollouts, dropped by the trainer.

    Raises:
        ValueError: a role has an endpoint but ``endpoint`` is ``None``.
    """

    def __init__(self, policies: PoliciesConfig, unwrap: Callable[[Any], Any] = lambda m: m,
                 endpoint: EndpointPlayer | None = None) -> None:
        if any(policies.route(role) == "endpoint" for role in Role) and endpoint is None:
            raise ValueError("a role is played by an endpoint: pass an EndpointPlayer")
        self.policies, self.unwrap, self.endpoint = policies, unwrap, endpoint
        self.adapter_routes: list[Route] = [f"adapter:{name}" for name in policies.adapters]
        self.tracker = RowTracker()
        self.rounds: list[list[tuple[int, Route]]] = []
        #: this batch's rows whose endpoint request failed, with the failure (issue 45: dropped)
        self.failed_rows: dict[int, Any] = {}

    # ------------------------------------------------------------------ generation

    def start_rollouts(self) -> None:
        """A new generation batch begins (TRL's ``_generate``)."""
        self.tracker.start()
        self.rounds = []
        self.failed_rows = {}

    def generate_round(self, model: torch.nn.Module, prompt_ids: list[list[int]], environments: Sequence[Any],
                       generate: Callable[[list[list[int]]], tuple[list[list[int]], Any]]) -> tuple[list[list[int]], Any]:
        """One round of TRL's loop, each row generated by its acting role's policy.

        Args:
            model: the policy (its adapters are switched here).
            prompt_ids: the round's prompts (token ids).
            environments: the batch's environments, one per row (their ``trace.observation``).
            generate: TRL's generation of a list of prompts: ``(completion_ids, logprobs)``.

        Returns:
            ``(completion_ids, logprobs)`` in the order of ``prompt_ids`` (``logprobs`` ``None``
            unless every route's generation returned them).
        """
        rows = self.tracker.rows(prompt_ids)
        observations = [environments[row].trace.observation for row in rows]
        routes = [self.policies.route(obs.role if obs is not None else None) for obs in observations]
        completions: list[list[int]] = [[] for _ in prompt_ids]
        logprobs: list[Any] = [None for _ in prompt_ids]
        for route in dict.fromkeys(routes):
            idx = [i for i, r in enumerate(routes) if r == route]
            if route == "endpoint":
                assert self.endpoint is not None, "checked in __init__"
                ids, lps = self.endpoint.play([observations[i] for i in idx]), None
                for i, failure in zip(idx, self.endpoint.last_failures, strict=True):
                    if failure is not None:  # the rollout fails: the trainer drops it
                        self.failed_rows.setdefault(rows[i], failure)
            else:
                with use_route(self.unwrap(model), route):
                    ids, lps = generate([prompt_ids[i] for i in idx])
            for j, i in enumerate(idx):
                completions[i] = list(ids[j])
                logprobs[i] = lps[j] if lps is not None else None
        self.tracker.advance(rows, prompt_ids, completions)
        self.rounds.append(list(zip(rows, routes, strict=True)))
        return completions, (logprobs if all(lp is not None for lp in logprobs) else None)

    # ------------------------------------------------------------------ scoring

    def token_routes(self, segments: Sequence[Sequence[Segment] | None], width: int) -> torch.Tensor:
        """``(B, width)`` long: each token's adapter index in :attr:`adapter_routes`, ``-1`` for
        tokens of no adapter (untrained roles, tool results, padding, after the debate)."""
        out = torch.full((len(segments), width), -1, dtype=torch.long)
        for k, segs in enumerate(segments):
            for seg in segs or []:
                if seg.owner is None:
                    continue
                route = self.policies.route(seg.owner.role)
                if route in self.adapter_routes:
                    out[k, seg.start:min(seg.end, width)] = self.adapter_routes.index(route)
        return out

    def untrained_mask(self, segments: Sequence[Sequence[Segment] | None], width: int) -> torch.Tensor:
        """``(B, width)`` float: 0 on the tokens of untrained roles (frozen, endpoint), 1 elsewhere."""
        out = torch.ones((len(segments), width))
        for k, segs in enumerate(segments):
            for seg in segs or []:
                if seg.owner is not None and not self.policies.trained(seg.owner.role):
                    out[k, seg.start:min(seg.end, width)] = 0.0
        return out

    def logps(self, model: torch.nn.Module, routes: torch.Tensor | None,
              compute: Callable[[torch.nn.Module], tuple[torch.Tensor, torch.Tensor | None, Any]]) -> tuple[Any, ...]:
        """TRL's per-token ``(logps, entropies, aux_loss)``, each token's from its adapter's pass.

        Args:
            model: the policy as TRL passes it (the DDP wrapper in the loss).
            routes: ``(B, T)`` adapter index per completion token (TRL's ``(B, logits_to_keep)``),
                or ``None`` (one pass, as is).
            compute: TRL's computation on a model.

        With gradients on, every adapter's pass runs (see the module docstring); without, only
        those with tokens. Inside a pass with adapters off (TRL's reference), one pass.

        Raises:
            ValueError: ``routes`` and the log-probs differ in shape.
        """
        unwrapped = self.unwrap(model)
        if not self.adapter_routes or routes is None or adapters_off(unwrapped):
            return compute(model)
        indices = list(range(len(self.adapter_routes)))
        if not torch.is_grad_enabled():
            indices = [i for i in indices if bool((routes == i).any())] or [0]
        passes: list[tuple[int, tuple[Any, ...]]] = []
        for index in indices:
            with use_route(unwrapped, self.adapter_routes[index]):
                passes.append((index, compute(model if not passes else unwrapped)))
        logps, entropies, _ = passes[0][1]
        if routes.shape != logps.shape:
            raise ValueError(f"token routes {tuple(routes.shape)} do not match the log-probs {tuple(logps.shape)}")
        where = routes.to(logps.device)
        for index, (lp, ent, _) in passes[1:]:
            chosen = where == index
            logps = torch.where(chosen, lp, logps)
            if entropies is not None and ent is not None:
                entropies = torch.where(chosen, ent, entropies)
        auxes = [aux for _, (_, _, aux) in passes if aux is not None]
        return logps, entropies, (torch.stack(auxes).mean() if auxes else None)

    # ------------------------------------------------------------------ the loss channels

    def using(self, model: torch.nn.Module, role: Role) -> AbstractContextManager[None]:
        """``role``'s policy active on ``model`` while the block runs (nothing to switch without adapters)."""
        return use_route(self.unwrap(model), self.policies.route(role))

    def per_role(self, model: torch.nn.Module, items: Sequence[Any], role_of: Callable[[Any], Role],
                 compute: Callable[[list[Any]], tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
        """``compute(items)`` (a tuple of ``(N, ...)`` tensors) with each item scored under its
        role's policy: one call per role present, rows put back in the order of ``items``."""
        roles = [Role(role_of(item)) for item in items]
        if not roles:
            return compute([])
        parts: list[tuple[list[int], tuple[torch.Tensor, ...]]] = []
        for role in dict.fromkeys(roles):
            idx = [i for i, r in enumerate(roles) if r is role]
            with self.using(model, role):
                parts.append((idx, compute([items[i] for i in idx])))
        if len(parts) == 1:
            return parts[0][1]
        order = torch.tensor([i for idx, _ in parts for i in idx])
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(len(order))
        return tuple(torch.cat([out[n] for _, out in parts])[inverse.to(parts[0][1][n].device)]
                     for n in range(len(parts[0][1])))

    def trained_roles(self, roles: frozenset[Role]) -> frozenset[Role]:
        """``roles`` without the untrained ones (a channel's roles, narrowed)."""
        return frozenset(role for role in roles if self.policies.trained(role))
