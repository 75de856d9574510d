"""The roles' LoRA adapters on one base model, through PEFT's multi-adapter API (Hugging Face
PEFT >= 0.21: ``get_peft_model``, ``PeftModel.add_adapter``, ``set_adapter``,
``set_requires_grad``, ``disable_adapter``, ``save_pretrained``, ``PeftModel.from_pretrained``).

One base model carries every adapter; PEFT freezes the base weights when it wraps the model.
:func:`use_route` makes one role's policy the active one for a forward or a generation: its
adapter (``adapter:NAME``), or every adapter off (``frozen``). PEFT's ``set_adapter`` also marks
the adapters it does not activate as not trainable (``requires_grad=False``); a role switch in
the middle of a training step must not do that (the optimiser, DDP's reducer and the autograd
graph of the forward already run all hold those parameters), so :func:`use_route` gives every
trained adapter its gradient back after each switch.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from trainer_client.policies.settings import PoliciesConfig, Route

if TYPE_CHECKING:
    from peft import PeftModel

__all__ = ["adapter_parameters", "attach_adapters", "is_adapter_model", "load_adapter_model", "optimizer_groups",
           "use_route"]


def is_adapter_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a PEFT model (adapters attached)."""
    from peft import PeftModel

    return isinstance(model, PeftModel)


def attach_adapters(model: torch.nn.Module, policies: PoliciesConfig) -> torch.nn.Module:
    """``model`` wrapped by PEFT with one LoRA adapter per name in ``policies.adapters`` (each
    with its :meth:`~PoliciesConfig.lora_of` settings), every adapter trainable, the base frozen.
    Returns ``model`` itself when no role has an adapter.

    Raises:
        ValueError: PEFT finds no target module of that name in the model.
    """
    names = policies.adapters
    if not names:
        return model
    from peft import LoraConfig, get_peft_model

    def config(name: str) -> LoraConfig:
        lora = policies.lora_of(name)
        return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                          target_modules=lora.target_modules, task_type="CAUSAL_LM")

    peft_model = get_peft_model(model, config(names[0]), adapter_name=names[0])  # type: ignore[arg-type]  # a PreTrainedModel
    for name in names[1:]:
        peft_model.add_adapter(name, config(name))
    peft_model.set_adapter(names[0])
    peft_model.set_requires_grad(names, requires_grad=True)
    return peft_model


def adapter_parameters(model: torch.nn.Module, name: str) -> dict[str, torch.nn.Parameter]:
    """Adapter ``name``'s parameters by their names in ``model``: PEFT names them
    ``...lora_A.<name>.weight``, ``...lora_embedding_A.<name>``, ``...lora_magnitude_vector.<name>...``;
    the name must follow a ``lora_*`` component exactly (an adapter named like a module, e.g.
    ``mlp``, must not take every adapter's parameters)."""
    pattern = re.compile(rf"(^|\.)lora_[A-Za-z_]+\.{re.escape(name)}(\.|$)")
    return {key: p for key, p in model.named_parameters() if pattern.search(key)}


def optimizer_groups(model: torch.nn.Module, policies: PoliciesConfig, learning_rate: float,
                     weight_decay: float = 0.0) -> list[dict[str, Any]]:
    """One AdamW parameter group per adapter, with its learning rate
    (:meth:`~PoliciesConfig.learning_rate_of`, default ``learning_rate``).

    Raises:
        ValueError: an adapter without parameters (nothing would train it).
    """
    groups = []
    for name in policies.adapters:
        params = list(adapter_parameters(model, name).values())
        if not params:
            raise ValueError(f"adapter {name!r} has no parameters in the model")
        groups.append({"params": params, "lr": policies.learning_rate_of(name, learning_rate),
                       "weight_decay": weight_decay, "adapter": name})
    return groups


@contextmanager
def use_route(model: torch.nn.Module, route: Route) -> Iterator[None]:
    """Make ``route``'s policy the active one while the block runs (see the module docstring).

    ``adapter:NAME`` activates that adapter; ``frozen`` turns every adapter off (PEFT's
    ``disable_adapter``: the base model); ``shared`` and ``endpoint`` change nothing (there is
    no adapter, or the model does not play the turn). The previously active adapter is active
    again afterwards. Inside a block where adapters are off (TRL's reference pass), activating an
    adapter keeps them off: PEFT's ``set_adapter`` does not re-enable disabled layers.
    """
    if not is_adapter_model(model) or route in ("shared", "endpoint"):
        yield
        return
    if route == "frozen":
        with cast("PeftModel", model).disable_adapter():
            yield
        return
    peft_model = cast("PeftModel", model)
    name = route.removeprefix("adapter:")
    previous = peft_model.active_adapter
    trained = list(peft_model.peft_config)
    peft_model.set_adapter(name)
    peft_model.set_requires_grad(trained, requires_grad=True)
    try:
        yield
    finally:
        peft_model.set_adapter(previous)
        peft_model.set_requires_grad(trained, requires_grad=True)


def load_adapter_model(directory: str | Path, adapter: str) -> tuple[Any, Any]:
    """``(model, tokenizer)``: the base model with ``directory/adapter`` (a PEFT adapter folder
    ``mathdebate train`` wrote under ``final/``) on it, in inference mode; the tokenizer from
    ``directory`` (where training saved it), else from the base.

    The base is the adapter's ``base_model_name_or_path`` (a hub id or the path training loaded;
    PEFT's ``AutoPeftModelForCausalLM`` reads the same field).

    Raises:
        FileNotFoundError: no ``adapter_config.json`` in ``directory/adapter``.
    """
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(directory) / adapter
    if not (folder / "adapter_config.json").exists():
        adapters = sorted(p.parent.name for p in Path(directory).glob("*/adapter_config.json"))
        raise FileNotFoundError(f"no adapter {adapter!r} in {directory} (adapters there: {', '.join(adapters) or 'none'})")
    base_path = PeftConfig.from_pretrained(str(folder)).base_model_name_or_path
    assert base_path is not None, "PEFT writes base_model_name_or_path into adapter_config.json"
    base = AutoModelForCausalLM.from_pretrained(base_path)
    model = PeftModel.from_pretrained(base, str(folder), adapter_name=adapter, is_trainable=False)
    has_tokenizer = (Path(directory) / "tokenizer_config.json").exists()
    tokenizer = AutoTokenizer.from_pretrained(str(directory) if has_tokenizer else base_path)
    return model, tokenizer
