"""The offline tiny models that tests, the demo and the ablations train: their recipes
(:mod:`~trainer_client.tiny_models.recipes`), the scripted warm-up debates
(:mod:`~trainer_client.tiny_models.warmup_debates`), the build with its committed copies in ``pinned/``
(:mod:`~trainer_client.tiny_models.build`) and the settings their learning runs use
(:mod:`~trainer_client.tiny_models.run_recipe`)."""
