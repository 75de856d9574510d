"""mathdebate's trainer side: reward shaping, the TRL ``environment_factory`` adapter and the
GRPO trainer. The shaping core needs only numpy; the trainer needs the ``train`` extra."""
