"""The ``--policy`` specs of ``mathdebate eval``: ``scripted:reference``, ``scripted:noisy[:P]``,
``hf:PATH`` (``hf:DIR#ADAPTER``: a role adapter under a run's ``final/``),
``openai:BASE_URL[#MODEL]`` and ``openai-tools:BASE_URL[#MODEL]`` (see :mod:`trainer_client.evaluation.policies`),
and one policy per role."""

from __future__ import annotations

from collections.abc import Sequence

from env_server.protocol.markers import Role
from trainer_client.evaluation.hf_policy import HFPolicy
from trainer_client.evaluation.openai_policy import OpenAIPolicy
from trainer_client.evaluation.policies import Policy, PolicyOptions, ScriptedPolicy

__all__ = ["build_policies", "parse_policy"]


def parse_policy(spec: str, options: PolicyOptions) -> Policy:
    """Build the policy a spec names (see the module docstring).

    Raises:
        ValueError: an unknown or malformed spec, or ``openai:`` without a model name.
    """
    kind, _, rest = spec.partition(":")
    if kind == "scripted":
        name, _, p = rest.partition(":")
        try:
            probability = float(p) if p else (0.3 if name == "noisy" else 0.0)
        except ValueError:
            raise ValueError(f"bad error probability in {spec!r}") from None
        return ScriptedPolicy(spec, name, probability, options)
    if kind == "hf" and rest:
        return HFPolicy(spec, rest, options)
    if kind in ("openai", "openai-tools") and rest:
        base_url, _, model = rest.partition("#")
        model = model or options.model or ""
        if not model:
            raise ValueError(f"{spec!r} names no model: write {kind}:URL#MODEL or pass --model NAME")
        return OpenAIPolicy(spec, base_url, model, options, layout="tools" if kind == "openai-tools" else "chat")
    raise ValueError(f"unknown policy {spec!r}: use scripted:reference, scripted:noisy[:P], hf:PATH[#ADAPTER], "
                     "openai:URL[#MODEL] or openai-tools:URL[#MODEL]")


def build_policies(default: str | None, per_role: dict[Role, str | None], options: PolicyOptions,
                   roles: Sequence[Role] = tuple(Role)) -> dict[Role, Policy]:
    """One policy per role in ``roles`` (the roles the run plays): the role's own spec, else
    ``default``. Roles with the same spec share one instance (one model load, one client, one
    set of counters).

    Raises:
        ValueError: a role with no spec, or a bad spec.
    """
    specs: dict[Role, str] = {}
    for role in roles:
        spec = per_role.get(role) or default
        if not spec:
            raise ValueError(f"no policy for the {role.value}: pass --policy or --policy-{role.value}")
        specs[role] = spec
    built: dict[str, Policy] = {}
    for spec in dict.fromkeys(specs.values()):
        built[spec] = parse_policy(spec, options)
    return {role: built[spec] for role, spec in specs.items()}
