"""The ``policies`` section of the config: which policy plays each role (torch-free, so that
reading a config never imports torch or PEFT).

One entry per role; a role without an entry plays the base policy, as before this section
existed (no section at all is exactly the shared policy: one set of weights, every role)::

    policies:
      lora: {r: 8, alpha: 16}                 # shared LoRA settings (an entry may override them)
      solver: {adapter: solver, learning_rate: 1e-4}
      verifier: {adapter: verifier}
      judge: {frozen: true}                   # or {endpoint: "openai:http://host:8001/v1#model"}
      phases: {steps: 25, order: [verifier, solver]}   # optional: adapters train in turn

Routes (:meth:`PoliciesConfig.route`): ``adapter:NAME`` (the role's LoRA adapter on the base,
trained), ``frozen`` (the base with every adapter off, never trained), ``endpoint`` (an
OpenAI-compatible endpoint, never trained) and ``shared`` (the base itself, trained: only when
no role has an adapter). Once any role has an adapter the base weights are frozen, so a role
without an entry is then frozen too.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from env_server.protocol.markers import Role

__all__ = ["ENDPOINT_KINDS", "LoraSettings", "PhaseSchedule", "PoliciesConfig", "RolePolicy", "Route", "parse_endpoint"]

#: The endpoint spec kinds, as ``mathdebate eval`` names them: ``openai:`` sends the role's chat
#: as the server built it, ``openai-tools:`` the tool-call layout of a model trained here.
ENDPOINT_KINDS = ("openai", "openai-tools")
_ADAPTER_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
#: TRL 1.16 names its reference copy of a PEFT adapter ``ref``; PEFT's own default is ``default``.
_RESERVED = ("ref", "default")

Route = str
"""``"shared"``, ``"frozen"``, ``"endpoint"`` or ``"adapter:NAME"``."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoraSettings(_Strict):
    """LoRA settings of an adapter (PEFT's ``LoraConfig``: Hu et al. 2021, arXiv 2106.09685,
    ``W x + (alpha / r) · B A x`` with ``A ∈ R^{r×k}``, ``B ∈ R^{d×r}``, ``B`` initialised to 0,
    so a new adapter starts exactly at the base policy).

    Attributes:
        r: the rank.
        alpha: the scale numerator (``lora_alpha``).
        dropout: dropout on the adapter's input (``lora_dropout``).
        target_modules: module names (or PEFT's ``"all-linear"``); ``None``: PEFT's default for
            the architecture (``q_proj``, ``v_proj`` for Qwen2 and Llama).
    """

    r: int = Field(default=8, ge=1)
    alpha: int = Field(default=16, ge=1)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] | str | None = None


def parse_endpoint(spec: str) -> tuple[str, str, str]:
    """``(kind, base_url, model)`` of ``openai:BASE_URL#MODEL`` or ``openai-tools:BASE_URL#MODEL``.

    Raises:
        ValueError: another kind, no URL, or no ``#MODEL``.
    """
    kind, _, rest = spec.partition(":")
    base_url, _, model = rest.partition("#")
    if kind not in ENDPOINT_KINDS or not base_url.startswith(("http://", "https://")) or not model:
        raise ValueError(f"bad endpoint {spec!r}: write openai:http://HOST:PORT/v1#MODEL (or openai-tools:...)")
    return kind, base_url, model


class RolePolicy(_Strict):
    """The policy of one role: exactly one of ``adapter``, ``frozen: true`` or ``endpoint``.

    Attributes:
        adapter: the name of the role's LoRA adapter (trained); roles naming the same adapter
            share it (and must then agree on ``lora`` and ``learning_rate``).
        frozen: play with the base weights, adapters off; never trained.
        endpoint: ``openai:BASE_URL#MODEL`` (or ``openai-tools:``); the endpoint plays the
            role's turns; never trained.
        learning_rate: the adapter's learning rate (default: the run's ``learning_rate``).
        lora: the adapter's LoRA settings (default: ``policies.lora``).
    """

    adapter: str | None = None
    frozen: bool = False
    endpoint: str | None = None
    learning_rate: float | None = Field(default=None, gt=0)
    lora: LoraSettings | None = None

    @field_validator("adapter")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and (not _ADAPTER_NAME.match(value) or value in _RESERVED):
            raise ValueError(f"adapter name {value!r}: use letters, digits, '_' or '-', starting with a letter "
                             f"(not {' or '.join(_RESERVED)}); it names the adapter's folder under final/")
        return value

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None:
            parse_endpoint(value)
        return value

    @model_validator(mode="after")
    def _one_policy(self) -> RolePolicy:
        chosen = [name for name, on in (("adapter", self.adapter is not None), ("frozen", self.frozen),
                                        ("endpoint", self.endpoint is not None)) if on]
        if len(chosen) != 1:
            raise ValueError(f"give exactly one of adapter, frozen: true or endpoint (got {', '.join(chosen) or 'none'})")
        if self.adapter is None and (self.learning_rate is not None or self.lora is not None):
            raise ValueError("learning_rate and lora belong to an adapter; a frozen or endpoint role is not trained")
        return self


class PhaseSchedule(_Strict):
    """Adapters trained in turn: optimizer steps ``[0, steps)`` update only the adapter of
    ``order[0]``'s role, ``[steps, 2·steps)`` only ``order[1]``'s, and so on, cycling through
    ``order``; every role still plays its turns with its own adapter in every step. A verifier phase
    is then a critic trained against a generator held fixed (CTRL, arXiv 2502.03492), a solver
    phase the converse.

    Attributes:
        steps: optimizer steps per phase (``≥ 1``).
        order: the role whose adapter each phase trains (at least two entries; a role may recur,
            e.g. ``[verifier, verifier, solver]`` for two verifier phases per solver phase).
    """

    steps: int = Field(ge=1)
    order: list[Role] = Field(min_length=2)

    def role_at(self, step: int) -> Role:
        """The role whose adapter optimizer step ``step`` (0-based) trains.

        Raises:
            ValueError: ``step < 0``.
        """
        if step < 0:
            raise ValueError(f"step {step} < 0")
        return self.order[(step // self.steps) % len(self.order)]


class PoliciesConfig(_Strict):
    """Per-role policies (see the module docstring).

    Attributes:
        solver, verifier, judge: each role's :class:`RolePolicy`, or ``None`` (the base policy).
        lora: the LoRA settings of every adapter without its own.
        phases: train the adapters in turn (:class:`PhaseSchedule`); ``None``: every adapter at
            every step.
    """

    solver: RolePolicy | None = None
    verifier: RolePolicy | None = None
    judge: RolePolicy | None = None
    lora: LoraSettings = Field(default_factory=LoraSettings)
    phases: PhaseSchedule | None = None

    @field_validator("judge")
    @classmethod
    def _judge_untrained(cls, value: RolePolicy | None) -> RolePolicy | None:
        if value is not None and value.adapter is not None:
            raise ValueError("the judge is never trained (it earns no reward of its own): give it frozen: true or an "
                             "endpoint")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> PoliciesConfig:
        if any(e is not None and e.frozen for e in map(self.entry, Role)) and not self.adapters:
            raise ValueError("frozen: true needs the base weights frozen, i.e. at least one role with an adapter "
                             "(without adapters the shared policy trains the base)")
        for name in self.adapters:
            entries = [self.entry(role) for role in self.adapter_roles(name)]
            own = {(e.learning_rate, e.lora.model_dump_json() if e.lora else None) for e in entries
                   if e is not None and (e.learning_rate is not None or e.lora is not None)}
            if len(own) > 1:
                raise ValueError(f"adapter {name!r} is shared by {', '.join(r.value for r in self.adapter_roles(name))} "
                                 "with different learning_rate or lora settings")
        if self.phases is not None:
            self._check_phases(self.phases)
        return self

    def _check_phases(self, phases: PhaseSchedule) -> None:
        routes = [self.route(role) for role in phases.order]
        bare = [role.value for role, route in zip(phases.order, routes, strict=True) if not route.startswith("adapter:")]
        if bare:
            raise ValueError(f"phases.order names {', '.join(bare)}, which has no adapter (a phase trains a role's "
                             "adapter)")
        named = {route.removeprefix("adapter:") for route in routes}
        if len(named) < 2:
            raise ValueError("phases.order trains one adapter only: give roles with different adapters")
        if missing := [name for name in self.adapters if name not in named]:
            raise ValueError(f"adapter {', '.join(map(repr, missing))} is in no phase of phases.order and would never "
                             "train")

    def phase_adapter(self, step: int) -> str | None:
        """The adapter optimizer step ``step`` trains under ``phases``; ``None`` without phases
        (every adapter trains)."""
        if self.phases is None:
            return None
        return self.route(self.phases.role_at(step)).removeprefix("adapter:")

    def entry(self, role: Role) -> RolePolicy | None:
        """The role's entry, ``None`` without one."""
        return getattr(self, Role(role).value)

    @property
    def active(self) -> bool:
        """Whether any role has an entry (no entry: exactly the shared policy of old)."""
        return any(self.entry(role) is not None for role in Role)

    @property
    def adapters(self) -> list[str]:
        """The adapter names, in role order, each once."""
        names = [e.adapter for e in (self.entry(role) for role in Role) if e is not None and e.adapter is not None]
        return list(dict.fromkeys(names))

    def adapter_roles(self, name: str) -> list[Role]:
        """The roles that play with adapter ``name``."""
        return [role for role in Role if (e := self.entry(role)) is not None and e.adapter == name]

    def lora_of(self, name: str) -> LoraSettings:
        """Adapter ``name``'s LoRA settings (its roles' own, else the shared ones)."""
        own = [e.lora for role in self.adapter_roles(name) if (e := self.entry(role)) is not None and e.lora is not None]
        return own[0] if own else self.lora

    def learning_rate_of(self, name: str, default: float) -> float:
        """Adapter ``name``'s learning rate (its roles' own, else ``default``)."""
        own = [e.learning_rate for role in self.adapter_roles(name)
               if (e := self.entry(role)) is not None and e.learning_rate is not None]
        return own[0] if own else default

    def route(self, role: Role | None) -> Route:
        """Where a turn of ``role`` is generated and scored (``None``: a turn after the debate
        ended, played by the base policy: ``shared`` without adapters, else ``frozen``)."""
        entry = self.entry(role) if role is not None else None
        if entry is not None and entry.adapter is not None:
            return f"adapter:{entry.adapter}"
        if entry is not None and entry.endpoint is not None:
            return "endpoint"
        return "frozen" if self.adapters else "shared"

    def trained(self, role: Role) -> bool:
        """Whether ``role``'s tokens are trained (an adapter, or the shared base of old)."""
        return self.route(role).startswith("adapter:") or self.route(role) == "shared"

    def describe(self) -> str:
        """One line: each role's route (for logs)."""
        return ", ".join(f"{role.value}: {self.route(role)}" for role in Role)

