"""A real GRPO trainer and a constructed two-row batch, for the loss-channel tests."""

from __future__ import annotations

import os

import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from datasets import Dataset
from trl import GRPOConfig

from trainer_client.trl_compat import checkpointing_off


def zero_reward(completions, **kwargs):
    return [0.0] * len(completions)


def make_args(tmp_path) -> GRPOConfig:
    return GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=32, report_to=[], save_strategy="no", **checkpointing_off(GRPOConfig))


def make_trainer(cls, model, tokenizer, tmp_path, **kwargs):
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}]}] * 4)
    trainer = cls(model=model, reward_funcs=[zero_reward], args=make_args(tmp_path), train_dataset=dataset,
                  processing_class=tokenizer, **kwargs)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train() in a real run
    return trainer


def make_batch(tokenizer, sites=None) -> dict:
    """Two rows: a chat prompt and a completion whose tokens 3..9 are the erring turn."""
    torch.manual_seed(0)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 6 times 7?"}], add_generation_prompt=True,
                                           tokenize=True, return_dict=False)
    prompt_ids = torch.tensor([prompt, prompt])
    completion_ids = torch.randint(10, len(tokenizer) - 1, (2, 12))
    completion_mask = torch.ones_like(completion_ids)
    completion_mask[1, 10:] = 0
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor([[0.5] * 12, [-0.5] * 12]),
        "num_items_in_batch": completion_mask.sum(),
        "tool_mask": torch.ones_like(completion_ids),
        "sdpo_sites": sites if sites is not None else [[], []],
    }
