"""mathdebate's trainer side: reward shaping, the TRL ``environment_factory`` adapter and the
GRPO trainer. The shaping core needs only numpy; the trainer needs the ``train`` extra."""

__all__ = ["environment_factory"]


def __getattr__(name: str):
    # Lazy, so that ``import trainer_client.credit.shaping`` stays light (numpy only).
    if name == "environment_factory":
        from trainer_client.rollout.environment import environment_factory

        return environment_factory
    raise AttributeError(f"module 'trainer_client' has no attribute {name!r}")
