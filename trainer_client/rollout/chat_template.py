"""The chat template and token layout TRL's tool loop renders a rollout with (trl 1.16), shared by
every path that must see what the policy saw in training: the tiny models' warm-up, the SFT
control, held-out prompts, the ``hf:`` and ``openai-tools:`` eval policies and hint probes."""

from __future__ import annotations

from typing import Any

__all__ = ["tool_result_suffix", "training_chat_template"]


def tool_result_suffix(tokenizer, tool_message: dict[str, Any], template: str | None = None) -> list[int]:
    """What TRL appends after a tool call (trl 1.16 ``GRPOTrainer._get_tool_suffix_ids``): the
    tool result block and the next generation prompt, rendered with ``template`` (``None``: the
    tokenizer's own).

    Raises:
        ValueError: the template is not prefix-preserving (TRL raises the same).
    """
    dummy = [{"role": "user", "content": "dummy"},
             {"role": "assistant", "content": "",
              "tool_calls": [{"type": "function", "function": {"name": tool_message["name"], "arguments": {}}}]}]
    prefix = list(tokenizer.apply_chat_template(dummy, tokenize=True, return_dict=False, chat_template=template))
    full = list(tokenizer.apply_chat_template([*dummy, tool_message], add_generation_prompt=True, tokenize=True,
                                              return_dict=False, chat_template=template))
    eos_positions = [k for k, tok in enumerate(prefix) if tok == tokenizer.eos_token_id]
    prefix = prefix[: eos_positions[-1] + 1]
    if full[: len(prefix)] != prefix:
        raise ValueError("the chat template is not prefix-preserving: render with training_chat_template(tokenizer)")
    return full[len(prefix):]


def training_chat_template(tokenizer) -> str | None:
    """The chat template TRL renders prompts and tool results with during GRPO: trl 1.16
    ``GRPOTrainer.__init__`` sets ``self.chat_template = get_training_chat_template(processing_class)``
    (a prefix-preserving variant of a known template, ``None`` when the tokenizer's own already
    is). Warm-up data, the SFT control and held-out prompts use it so that they are token for
    token what the policy sees in training."""
    from trl.chat_template_utils import get_training_chat_template

    return get_training_chat_template(tokenizer)
