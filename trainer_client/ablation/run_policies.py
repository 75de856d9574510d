"""A finished run's policies for the held-out evaluation (``mathdebate ablate``): the model in
``<run>/final`` and, when the run trained per-role adapters (its ``config.yaml`` has a
``policies`` section with adapters), each role's policy on it."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import yaml

from env_server.protocol.markers import Role
from trainer_client.policies.settings import PoliciesConfig

__all__ = ["load_run_policies"]


def load_run_policies(run_dir: str | Path) -> tuple[Any, Any, Callable[[Role], AbstractContextManager[Any]]]:
    """``(model, tokenizer, play_as)`` of the run in ``run_dir``.

    Without adapters, ``final/`` is the whole model and ``play_as`` changes nothing. With them,
    the base (each adapter's ``base_model_name_or_path``) carries every ``final/<adapter>``, and
    ``play_as(role)`` activates the role's adapter, or turns the adapters off for a frozen role
    and for an endpoint role (the held-out evaluation has no endpoint: the base plays it).

    Raises:
        FileNotFoundError: no ``final/`` (or a missing adapter folder).
    """
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer_client.policies.adapters import use_route
    from trainer_client.training.reporting import weight_bars_off

    run_dir = Path(run_dir)
    final = run_dir / "final"
    settings = yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").exists() else {}
    policies = PoliciesConfig.model_validate((settings or {}).get("policies") or {})
    with weight_bars_off():
        if not policies.adapters:
            return (AutoModelForCausalLM.from_pretrained(final), AutoTokenizer.from_pretrained(final),
                    lambda role: nullcontext())
        first, *others = policies.adapters
        if not (final / first / "adapter_config.json").exists():
            raise FileNotFoundError(f"{final / first}: no adapter_config.json")
        base = PeftConfig.from_pretrained(str(final / first)).base_model_name_or_path
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(final / first),
                                          adapter_name=first)
        for name in others:
            model.load_adapter(str(final / name), adapter_name=name)
        tokenizer = AutoTokenizer.from_pretrained(final)

    def play_as(role: Role) -> AbstractContextManager[Any]:
        route = policies.route(role)
        return use_route(model, "frozen" if route == "endpoint" else route)

    return model, tokenizer, play_as
