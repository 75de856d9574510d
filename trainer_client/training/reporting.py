"""Run outputs: ``metrics.jsonl`` (one line per logged step) and a PNG of rewards and losses.

Metrics travel through TRL's own logging (so ``report_to`` tensorboard/wandb sees them too);
this callback only mirrors each training log line into a file. Besides the step lines
(``{"step": int, <metric>: float, ...}``), ``metrics.jsonl`` holds event lines, which carry an
``"event"`` key and no ``"step"``: the first line (``"start"``, with the run's provenance) and
one line per resume (``"resume"``: ``from_step``, ``checkpoint``, ``dropped_lines``, the
resumed process's provenance). Read the step lines with :func:`read_metrics`.

With ``eval_steps``, the evaluations during training have lines of their own,
``{"step": int, "eval/<metric>": float, ...}`` (:mod:`trainer_client.evaluation.during_training`;
the step the policy had trained, 0 before the first), read with :func:`read_eval_metrics`;
:func:`read_metrics` leaves them out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import ProgressCallback
from transformers.utils import logging as transformers_logging

from env_server.jsonio import read_jsonl
from trainer_client.evaluation.during_training import EVAL_PREFIX

__all__ = ["EVAL_CURVE_KEYS", "LOSS_KEYS", "ROLE_REWARD_KEYS", "SDPO_KEYS", "SMOOTHING_STEPS", "VERIFIER_KEYS",
           "MetricsFileCallback", "QuietProgressCallback", "is_eval_line", "metrics_events", "plot_metrics",
           "read_eval_metrics", "read_metrics", "trailing_mean", "weight_bars_off"]

LOSS_KEYS = ("loss/grpo", "loss/sdpo_jsd", "loss/trace_replay_dpo", "loss/total")
"""The SDPO channel's old metric name (it is a generalized JSD, not a KL): still logged with
the same value as ``loss/sdpo_jsd`` for one release, then removed."""
ROLE_REWARD_KEYS = ("debate/reward/solver", "debate/reward/verifier", "debate/judge_accuracy", "debate/episode_reward")
#: The verifier's verdicts on the step's own rollouts (trainer_client.credit.verdicts), a panel of ``training.png``.
VERIFIER_KEYS = ("debate/verifier/balanced_accuracy", "debate/verifier/accept_rate_right",
                 "debate/verifier/reject_rate_wrong", "debate/verifier/missing_verdict_share")
#: The evaluation curves drawn in ``training.png`` (validation problems, every ``eval_steps``).
EVAL_CURVE_KEYS = ("eval/first_answer_accuracy", "eval/sampled_accuracy", "eval/final_accuracy",
                   "eval/sampled_final_accuracy", "eval/balanced_verdict_accuracy")


def is_eval_line(line: dict[str, Any]) -> bool:
    """Whether a ``metrics.jsonl`` line is an evaluation during training's (it has ``eval/...`` keys)."""
    return any(key.startswith(EVAL_PREFIX) for key in line)


class MetricsFileCallback(TrainerCallback):
    """Appends every training log that carries the loss channels, and every evaluation during
    training (``eval/...``), to ``path`` as a JSON line ``{"step": int, <metric>: float, ...}``
    (the main process only).

    Args:
        path: the ``metrics.jsonl`` file.
        event: the event line written when training begins (``{"event": "start", ...}`` or
            ``{"event": "resume", ...}``); ``None``: none.
        keep_bytes: ``None``: a new file (an old one is emptied). A resume's byte offset: the
            file is cut there first (the lines logged after the checkpoint came from steps that
            are trained again), and the resume line says how many lines were dropped.
    """

    def __init__(self, path: str | Path, event: dict[str, Any] | None = None, keep_bytes: int | None = None) -> None:
        self.path = Path(path)
        self.event = event
        self.keep_bytes = keep_bytes

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        dropped = 0
        if self.keep_bytes is None:
            self.path.write_text("")
        elif self.path.exists():
            with self.path.open("r+b") as handle:
                handle.seek(self.keep_bytes)
                dropped = sum(1 for line in handle.read().splitlines() if line.strip())
                handle.truncate(self.keep_bytes)
        if self.event is not None:
            event = {**self.event, "dropped_lines": dropped} if self.keep_bytes is not None else self.event
            with self.path.open("a") as handle:
                handle.write(json.dumps(event) + "\n")

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not logs or ("loss/total" not in logs and not is_eval_line(logs)):
            return
        line = {"step": state.global_step}
        line.update({k: v for k, v in logs.items() if isinstance(v, (int, float)) and math.isfinite(v)})
        with self.path.open("a") as handle:
            handle.write(json.dumps(line) + "\n")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The training step lines of a ``metrics.jsonl`` (:class:`MetricsFileCallback`), in order,
    without its event lines (start, resumes) and its evaluation lines (:func:`read_eval_metrics`)."""
    return [line for _, line in read_jsonl(path) if "event" not in line and not is_eval_line(line)]


def read_eval_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The evaluation lines of a ``metrics.jsonl`` (``{"step": int, "eval/<metric>": float, ...}``,
    every ``eval_steps``), in order; empty when the run did not evaluate during training."""
    return [line for _, line in read_jsonl(path) if "event" not in line and is_eval_line(line)]


def metrics_events(path: str | Path) -> list[dict[str, Any]]:
    """The event lines of a ``metrics.jsonl``: its ``start`` line and a ``resume`` line per resume."""
    return [line for _, line in read_jsonl(path) if "event" in line]


class QuietProgressCallback(ProgressCallback):
    """The usual progress bar, without printing every log dict under it (the metrics are in
    ``metrics.jsonl`` and in whatever ``report_to`` sends them to)."""

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        return None


@contextmanager
def weight_bars_off() -> Iterator[None]:
    """transformers' own per-call progress bars off inside the block, back as they were after it:
    ``Loading weights`` (every ``from_pretrained``) and ``Writing model shards`` (every
    ``save_pretrained``, checkpoints and ``save_model`` included).

    transformers 5.x draws one for each load and save and has no per-call switch (5.24:
    ``core_model_loading.py`` and ``modeling_utils.save_pretrained`` use
    ``transformers.utils.logging.tqdm``), so a run that loads and saves the policy under its own
    bars (the training bar, ``ablate``'s runs and steps bars, the demo's held-out evaluation)
    printed a pair of bars per call. This turns them off with transformers' public switch
    (``utils.logging.disable_progress_bar``; the training bar is plain ``tqdm`` and stays).
    The switch is process-wide: a load in another thread during the block (a teacher model)
    is quiet too. A Hub download's bar (``huggingface_hub``'s own) is not affected.
    """
    was_on = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            transformers_logging.enable_progress_bar()


#: Window of the trailing mean drawn over per-step rewards (:func:`plot_metrics`).
SMOOTHING_STEPS = 10


def trailing_mean(values: Sequence[float], window: int) -> list[float]:
    """Mean of the last ``window`` values at each position (fewer at the start)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


#: Trace replay's per-step figures (the third panel of the training plot when logged).
REPLAY_KEYS = ("replay/chosen_logp", "replay/rejected_logp", "replay/heldout/chosen_logp", "replay/heldout/rejected_logp")
#: Hint distillation's own objective (trainer_client.losses.hint_distillation): does the teacher know more than
#: its student at the distilled sites, and does the divergence to it fall?
SDPO_KEYS = ("sdpo/teacher_advantage", "loss/sdpo_jsd")
#: The step's peak memory, GiB (the last panel, with each channel's ``time/<channel>_s``).
PEAK_MEMORY_KEY = "memory/peak_gib"


def _plot_costs(ax: Any, lines: list[dict[str, Any]], keys: Sequence[str]) -> None:
    """Each channel's seconds per step (``time/<channel>_s``) and, on a second axis, the step's
    peak memory (``memory/peak_gib``)."""
    _draw_keys(ax, lines, keys)
    ax.set_xlabel("step")
    ax.set_ylabel("seconds per step")
    ax.set_title("loss channels' cost")
    ax.grid(alpha=0.3)
    memory = [(line["step"], line[PEAK_MEMORY_KEY]) for line in lines if PEAK_MEMORY_KEY in line]
    handles, labels = ax.get_legend_handles_labels()
    if memory:
        twin = ax.twinx()
        steps, values = zip(*memory, strict=True)
        drawn = twin.plot(steps, values, color="black", linestyle="--", label=f"{PEAK_MEMORY_KEY} (right)")
        twin.set_ylabel("GiB")
        handles, labels = [*handles, *drawn], [*labels, drawn[0].get_label()]
    ax.legend(handles, labels, fontsize=8)


def _draw_keys(ax: Any, lines: list[dict[str, Any]], keys: Sequence[str]) -> None:
    """Each of ``keys`` that ``lines`` hold, against the step, with markers (no smoothing)."""
    for key in keys:
        points = [(line["step"], line[key]) for line in lines if key in line]
        if points:
            steps, values = zip(*points, strict=True)
            ax.plot(steps, values, marker="o", label=key)


def _plot_lines(ax: Any, lines: list[dict[str, Any]], keys: Sequence[str], title: str) -> None:
    """A panel of :func:`_draw_keys` with its title, grid and legend."""
    _draw_keys(ax, lines, keys)
    ax.set_xlabel("step")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


#: The credit panel's metrics (``credit/fidelity/<role>``, ``credit/signal/<role>``: credit/fidelity.py).
CREDIT_PREFIXES = ("credit/fidelity/", "credit/signal/")


def plot_metrics(metrics_path: str | Path, out_path: str | Path) -> Path:
    """Plot per-role rewards, the three loss channels and, when logged, the verifier's verdicts on
    each step's rollouts (:data:`VERIFIER_KEYS`, smoothed), the evaluation during
    training on validation problems (:data:`EVAL_CURVE_KEYS`), trace replay's chosen and
    rejected log-probs (trained and held-out pairs), hint distillation's teacher advantage at the
    right token beside its JSD (:data:`SDPO_KEYS`), each role's credit fidelity and signal
    (smoothed like the rewards) and what the channels cost (each one's
    seconds per step, the step's peak memory: :mod:`trainer_client.losses.costs`) against the step. With 10 steps or
    more, each reward is drawn faint per step with its trailing mean over
    :data:`SMOOTHING_STEPS` steps on top (one batch holds only a few problems, so per-step
    rewards jump between 0 and 1).

    Args:
        metrics_path: a ``metrics.jsonl`` written by :class:`MetricsFileCallback`.
        out_path: the PNG to write.

    Returns:
        ``out_path``.

    Raises:
        ValueError: the metrics file has no lines.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = read_metrics(metrics_path)
    if not lines:
        raise ValueError(f"{metrics_path} holds no metrics")
    evaluations = read_eval_metrics(metrics_path)
    replay = any(key in line for line in lines for key in REPLAY_KEYS)
    cost_keys = sorted({key for line in lines for key in line if key.startswith("time/") and key.endswith("_s")})
    cost = bool(cost_keys) or any(PEAK_MEMORY_KEY in line for line in lines)
    # does each role's advantage point the way its own turn went? (credit/fidelity.py)
    credit_keys = sorted({key for line in lines for key in line if key.startswith(CREDIT_PREFIXES)})
    verifier = any(key in line for line in lines for key in VERIFIER_KEYS)
    sdpo = any(SDPO_KEYS[0] in line for line in lines)
    count = 2 + verifier + bool(evaluations) + replay + sdpo + bool(credit_keys) + cost
    fig, axes = plt.subplots(1, count, figsize=(5.5 * count, 4))
    rewards_ax, loss_ax = axes[0], axes[1]
    smoothed = {rewards_ax}
    panels: list[tuple[Any, Sequence[str], str]] = [(rewards_ax, ROLE_REWARD_KEYS, "rewards"),
                                                    (loss_ax, LOSS_KEYS, "loss channels")]
    if verifier:  # is the verifier learning, and how much of a low accuracy is missing verdicts?
        smoothed.add(axes[2])
        panels.append((axes[2], VERIFIER_KEYS, "verifier: verdicts on the step's rollouts"))
    if evaluations:  # the curves a run is judged by: validation problems, never the held-out ones
        eval_ax = axes[2 + verifier]
        _plot_lines(eval_ax, evaluations, EVAL_CURVE_KEYS,
                    f"evaluation on {int(evaluations[-1].get('eval/problems', 0)) or 'the'} validation problems")
        eval_ax.set_ylim(-0.02, 1.02)
    first_extra = 2 + verifier + bool(evaluations)
    if replay:  # is trace replay still teaching? (saturation: the margin grows, the chosen side does not)
        panels.append((axes[first_extra], REPLAY_KEYS, "trace replay: log-probs (nats per pair)"))
    if sdpo:  # a teacher that knows more (advantage > 0) and a divergence that falls
        panels.append((axes[first_extra + replay], SDPO_KEYS, "hint distillation: teacher − student at the right "
                       "token, JSD (nats)"))
    if credit_keys:
        credit_ax = axes[first_extra + replay + sdpo]
        smoothed.add(credit_ax)
        panels.append((credit_ax, credit_keys, "credit: fidelity and signal per role"))
    if cost:  # what each channel costs in this run (trainer_client.losses.costs)
        _plot_costs(axes[-1], lines, cost_keys)
    for ax, keys, title in panels:
        for key in keys:
            points = [(line["step"], line[key]) for line in lines if key in line]
            if not points:
                continue
            steps, values = zip(*points, strict=True)
            if ax in smoothed and len(values) >= 10:
                drawn = ax.plot(steps, values, alpha=0.25, linewidth=1)
                ax.plot(steps, trailing_mean(values, SMOOTHING_STEPS), color=drawn[0].get_color(), linewidth=2,
                        label=f"{key} (mean of last {SMOOTHING_STEPS})")
            else:
                ax.plot(steps, values, marker="o", label=key)
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out_path = Path(out_path)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path
