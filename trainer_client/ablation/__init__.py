"""``mathdebate ablate``: the arms × seeds experiment (:mod:`~trainer_client.ablation.ablate`), its
kept runs (:mod:`~trainer_client.ablation.runs`), controls (the SFT control, answer-only figures, the
hint probe), interval statistics (:mod:`~trainer_client.ablation.stats`) and the report
(:mod:`~trainer_client.ablation.report`)."""
