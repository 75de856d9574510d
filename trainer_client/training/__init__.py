"""One training run and what it leaves: ``mathdebate train`` (:mod:`~trainer_client.training.train`),
checkpoints that hold the whole run and resuming from them (:mod:`~trainer_client.training.checkpoints`),
and the run's ``metrics.jsonl`` and ``training.png`` (:mod:`~trainer_client.training.reporting`)."""
