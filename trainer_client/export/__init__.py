"""``mathdebate export``: trajectory logs, eval outputs, training runs and ablations as Hugging
Face ``datasets`` (SFT chats, DPO pairs, episodes) with a dataset card. One job per module:
``sources`` (which layout), ``lines`` (episode lines, validated), ``problems`` (statements),
``sft``, ``pairs``, ``episodes`` (the rows), ``card`` (README.md), ``command`` (the CLI),
``errors`` (the typed refusals)."""
