"""Experiments on the trainer: ``mathdebate ablate`` (``ablate``, ``stats``), held-out
evaluation of a local model (``heldout``), the offline tiny models (``tiny_model``) and the
SFT control (``sft``)."""
