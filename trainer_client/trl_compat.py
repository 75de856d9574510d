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
