"""Name -> strategy class registry.

Strategies register themselves with the :func:`register_strategy` class decorator when their
module is imported; importing :mod:`trainer_client.credit.shaping` imports all built-in strategies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from trainer_client.credit.shaping.base import RewardShapingStrategy

__all__ = ["available_strategies", "get_strategy", "register_strategy", "strategy_class"]

_REGISTRY: dict[str, type[RewardShapingStrategy]] = {}

S = TypeVar("S", bound=type[RewardShapingStrategy])


def register_strategy(name: str) -> Callable[[S], S]:
    """Class decorator: register a :class:`RewardShapingStrategy` subclass under ``name``.

    Raises:
        TypeError: the decorated object is not a ``RewardShapingStrategy`` subclass.
        ValueError: ``name`` is empty or already registered.
    """
    if not name:
        raise ValueError("strategy name must be non-empty")

    def decorate(cls: S) -> S:
        if not (isinstance(cls, type) and issubclass(cls, RewardShapingStrategy)):
            raise TypeError(f"{cls!r} is not a RewardShapingStrategy subclass")
        if name in _REGISTRY:
            raise ValueError(f"reward shaping strategy {name!r} is already registered "
                             f"({_REGISTRY[name].__qualname__})")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def available_strategies() -> tuple[str, ...]:
    """The registered strategy names, sorted."""
    return tuple(sorted(_REGISTRY))


def strategy_class(name: str) -> type[RewardShapingStrategy]:
    """The class registered under ``name``.

    Raises:
        KeyError: unknown name; the message lists the available names.
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown reward shaping strategy {name!r}; available: "
                       f"{', '.join(available_strategies())}") from None


def get_strategy(name: str, **params: Any) -> RewardShapingStrategy:
    """Instantiate the strategy registered under ``name`` with ``params``.

    Raises:
        KeyError: unknown name; the message lists the available names.
        pydantic.ValidationError: invalid parameters for that strategy.
    """
    return strategy_class(name)(**params)
