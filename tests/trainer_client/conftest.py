"""Fixtures of the trainer's tests."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.train()  # training mode: metrics go to the "train" bucket, as in a real step
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)
