"""What each loss channel costs in a run: seconds per optimiser step, and the step's peak memory.

The trainer (:class:`~trainer_client.trainer.DebateGRPOTrainer`) logs, per optimiser step:

- ``time/<channel>_s`` (``time/sdpo_s``, ``time/replay_s``, ...): the seconds the channel took:
  its :meth:`~trainer_client.losses.base.LossChannel.prepare` (trace replay: storing new pairs
  with their reference log-probabilities) and batch metrics, its
  :meth:`~trainer_client.losses.base.LossChannel.loss` (forward, and what a fused loss
  computes there), and its own part of the backward;
- ``memory/peak_gib``: the step's peak memory, GiB: ``torch.cuda.max_memory_allocated`` on CUDA;
  on CPU the process's peak resident set (``VmHWM``, reset each step through
  ``/proc/self/clear_refs``; where that file cannot be written, ``ru_maxrss``, the peak since
  the process started).

The backward is one call for the whole loss, so a channel's part is read from tensor hooks on
each term: PyTorch's autograd engine runs, among the nodes ready to run, the most recently
created first (the CPU ready queue orders by sequence number), so the terms' own graphs, built
after GRPO's forward, are walked before GRPO's: the last-built channel first, down to where its
graph meets GRPO's (the shared hidden states) or the parameters. A channel's part is the time
from its term's hook to the next hook (another channel's, or GRPO's term's);
``tests/trainer_client/test_channel_costs.py`` checks the order. On CUDA every time is taken with CUDA
events and read once per step, after one synchronisation.
"""

from __future__ import annotations

import resource
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from transformers import TrainerCallback

__all__ = ["ChannelCosts", "PeakMemory"]

T = TypeVar("T")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


class PeakMemory:
    """The peak memory since :meth:`reset`, GiB (see the module docstring for what is measured).

    Args:
        device: the training device.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.resettable = self.cuda or (_CLEAR_REFS.exists() and _STATUS.exists())

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            return
        if self.resettable:
            try:
                _CLEAR_REFS.write_text("5")  # Linux: reset the peak resident set size (VmHWM)
            except OSError:
                self.resettable = False

    def gib(self) -> float:
        if self.cuda:
            return torch.cuda.max_memory_allocated() / 2**30
        if self.resettable:
            for line in _STATUS.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**20  # kB
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux


class ChannelCosts(TrainerCallback):
    """Per optimiser step, each channel's seconds and the step's peak memory (module docstring):
    a ``TrainerCallback`` that starts a step's accounting in ``on_step_begin`` and logs it in
    ``on_step_end`` (before the step's logs are written).

    The trainer runs a channel's work through :meth:`timed` and :meth:`loss`, and passes GRPO's
    term through :meth:`grpo_term`.

    Args:
        device: the training device.
        keys: the channels' keys (``time/<key>_s`` is logged for each, 0 when it did nothing).
        log: called with the step's metrics and ``"train"``.
    """

    def __init__(self, device: torch.device, keys: Sequence[str] = (),
                 log: Callable[[dict[str, float], str], None] | None = None) -> None:
        self.cuda = device.type == "cuda"
        self.memory = PeakMemory(device)
        self.keys, self.log = list(keys), log
        self._seconds: dict[str, float] = defaultdict(float)
        self._pending: list[tuple[str, Any, Any]] = []  # CUDA: (key, start event, end event)
        self._stamps: list[tuple[str | None, Any]] = []  # the step's backward hooks, in firing order
        self._last_order: list[str | None] = []

    def _now(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _add(self, key: str, start: Any, end: Any) -> None:
        if self.cuda:
            self._pending.append((key, start, end))
        else:
            self._seconds[key] += end - start

    def start_step(self) -> None:
        """Forget the last step's figures; reset the memory peak."""
        self._seconds.clear()
        self._pending.clear()
        self._stamps = []
        if self.cuda:
            torch.cuda.synchronize()
        self.memory.reset()

    def timed(self, key: str, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)``, its time counted to ``key`` (and, under ``torch.profiler``, recorded
        as ``channel/<key>``)."""
        start = self._now()
        try:
            with torch.profiler.record_function(f"channel/{key}"):
                return work(*args)
        finally:
            self._add(key, start, self._now())

    def loss(self, key: str, loss: Callable[..., tuple[torch.Tensor | None, dict[str, float]]],
             *args: Any) -> tuple[torch.Tensor | None, dict[str, float]]:
        """A channel's ``loss(*args)``, timed; the backward's arrival at its term is stamped."""
        value, metrics = self.timed(key, loss, *args)
        if value is not None:
            self._watch(key, value)
        return value, metrics

    def grpo_term(self, term: torch.Tensor) -> torch.Tensor:
        """GRPO's term, its backward stamped (where the last channel's part of the backward ends)."""
        self._watch(None, term)
        return term

    def _watch(self, key: str | None, term: torch.Tensor) -> None:
        if not term.requires_grad:
            return

        def stamp(grad: torch.Tensor) -> None:
            self._stamps.append((key, self._now()))

        term.register_hook(stamp)

    def end_step(self) -> dict[str, float]:
        """The step's ``time/<key>_s`` for every key and ``memory/peak_gib``: each channel gets
        the backward time from its term's stamp to the next stamp (the last one, to now)."""
        end = self._now()
        self._last_order = [key for key, _ in self._stamps]
        for i, (key, start) in enumerate(self._stamps):
            if key is not None:
                self._add(key, start, self._stamps[i + 1][1] if i + 1 < len(self._stamps) else end)
        self._stamps = []
        if self.cuda:
            torch.cuda.synchronize()
            for key, start, stop in self._pending:
                self._seconds[key] += start.elapsed_time(stop) / 1000.0
            self._pending.clear()
        keys = self.keys or sorted(self._seconds)
        return {**{f"time/{key}_s": self._seconds.get(key, 0.0) for key in keys}, "memory/peak_gib": self.memory.gib()}

    def backward_order(self) -> list[str | None]:
        """The keys of the last step's backward stamps in firing order (for tests)."""
        return list(self._last_order)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.start_step()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        metrics = self.end_step()
        if self.log is not None:
            self.log(metrics, "train")
