"""``mathdebate train``'s flags are the config's fields: the same types and the same choices."""

from __future__ import annotations

import argparse
from typing import Literal, get_args, get_origin

import pytest

from trainer_client.cli import TRAIN_FLAGS, _add_train_args, _train_config
from trainer_client.config import PRESETS, TrainConfig


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    _add_train_args(parser)
    return parser


@pytest.mark.parametrize("estimator", get_args(TrainConfig.model_fields["advantage_estimator"].annotation))
def test_every_estimator_the_config_accepts_the_flag_accepts(estimator: str) -> None:
    args = _parser().parse_args(["--advantage-estimator", estimator, "--max-steps", "7"])
    config = _train_config(args)
    assert config.advantage_estimator == estimator and config.max_steps == 7


def test_each_flag_takes_its_fields_type_and_choices() -> None:
    actions = {action.dest: action for action in _parser()._actions}
    for name in TRAIN_FLAGS:
        annotation = TrainConfig.model_fields[name].annotation
        action = actions[name]
        if get_origin(annotation) is Literal:
            assert list(action.choices) == list(get_args(annotation)), name
        elif annotation in (int, float):
            assert action.type is annotation, name
    assert list(actions["preset"].choices) == list(PRESETS)
    with pytest.raises(argparse.ArgumentError):
        _parser().parse_args(["--advantage-estimator", "ppo"])
