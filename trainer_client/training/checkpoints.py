"""Checkpoints that hold the whole run, and resuming from the last complete one.

transformers' ``Trainer`` saves the model, the optimizer, the scheduler, every process's
random states (Python, numpy, torch: the sampling streams of generation and of TRL's batch
shuffling) and ``trainer_state.json`` (step, log history) into ``checkpoint-N/`` every
``save_steps``, and ``Trainer.train(resume_from_checkpoint=...)`` restores all of them and skips
the data already trained on. What our channels and the environment need besides is added by
:class:`CheckpointStateCallback` (``on_save``, after transformers wrote its files):

- per process, ``checkpoint-N/mathdebate/rank<r>.json``: each loss channel's state
  (``LossChannel.state_dict``; trace replay: its replays in flight awaited and stored, the
  pair store's file and byte offset, its pair-sampling stream, the teacher calls, tokens and
  cost used), the shaping strategy's state, and the env-side bookkeeping (the session ledger,
  episodes re-run, the episodes of the checkpoint's last batch);
- then, once every process wrote its file, ``checkpoint-N/mathdebate_state.json`` from the
  main process: the step, the number of processes, where ``metrics.jsonl`` ended, the
  training config and its hash, the reference policy's identity (the initial policy's model and
  a fingerprint of its weights) and the run's provenance.

Both are written atomically (a temporary file renamed), ``mathdebate_state.json`` last: a
checkpoint is **complete** when it is there. A process killed while saving leaves an incomplete
checkpoint, which a resume skips for the previous complete one.

Resuming (:func:`resume_checkpoint`, :func:`load_resume_state`, :func:`restore_trainer_state`)
cuts ``metrics.jsonl`` and each process's pair store back to where they stood at the
checkpoint (what was logged and stored after it came from steps that are trained again), puts
the channels' and the strategy's state back, and refuses a checkpoint taken with another
number of processes or another initial policy.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from env_server.jsonio import write_json_atomic

__all__ = ["RANK_DIR", "RESUME_FREE_KEYS", "STATE_FILE", "CheckpointStateCallback", "ResumeError", "ResumeState",
           "channel_keys", "complete_checkpoints", "final_model_from_checkpoint", "load_resume_state", "restore_trainer_state",
           "resume_checkpoint", "training_config_hash"]

log = logging.getLogger(__name__)

#: The file whose presence makes a checkpoint complete (written last, by the main process).
STATE_FILE = "mathdebate_state.json"
#: The folder of the per-process state files inside a checkpoint.
RANK_DIR = "mathdebate"
#: Config keys that may change on resume without changing the training (where the run lives and
#: reaches its server, how it reports); any other difference is logged as a warning.
RESUME_FREE_KEYS = frozenset({"output_dir", "env_url", "env_token_env", "resume_from_checkpoint", "report_to",
                              "rewards_timeout_s", "vllm_server_base_url"})
FORMAT = 1
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


class ResumeError(RuntimeError):
    """A resume that cannot continue the run (no complete checkpoint, another number of
    processes, another initial policy); the message says which and what to do."""


def training_config_hash(config: Mapping[str, Any]) -> str:
    """SHA-256 of the config without :data:`RESUME_FREE_KEYS` (what decides the training)."""
    from env_server.provenance import config_hash

    return config_hash({k: v for k, v in config.items() if k not in RESUME_FREE_KEYS})


def complete_checkpoints(run_dir: str | Path) -> list[Path]:
    """The complete checkpoints (``checkpoint-N/`` holding :data:`STATE_FILE`) of a run, by step."""
    found = []
    for path in Path(run_dir).glob("checkpoint-*"):
        match = _CHECKPOINT.match(path.name)
        if match and (path / STATE_FILE).is_file():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def resume_checkpoint(spec: bool | str | Path, output_dir: str | Path) -> Path:
    """The checkpoint a resume continues from.

    Args:
        spec: ``True``: the last complete checkpoint in ``output_dir``; a path: that checkpoint
            when it holds :data:`STATE_FILE`, else the last complete checkpoint in that run folder.
        output_dir: the run's output folder.

    Raises:
        ResumeError: no complete checkpoint there, or a checkpoint of another run folder (a run
            continues in its own folder: its metrics, pairs and session ledger are there).
    """
    path = Path(output_dir) if isinstance(spec, bool) else Path(spec)
    found = [path] if (path / STATE_FILE).is_file() else complete_checkpoints(path)
    if not found:
        incomplete = sorted(p.name for p in path.glob("checkpoint-*"))
        raise ResumeError(f"no complete checkpoint in {path} (a checkpoint is complete when checkpoint-N/{STATE_FILE} "
                          f"exists{'; incomplete: ' + ', '.join(incomplete) if incomplete else ''}): train without "
                          "--resume to start the run, with save_steps > 0 to checkpoint it")
    if found[-1].parent.resolve() != Path(output_dir).resolve():
        raise ResumeError(f"{found[-1]} is a checkpoint of the run in {found[-1].parent}, not of {output_dir}: a run "
                          "continues in its own folder (set output_dir to it)")
    return found[-1]


@dataclass
class ResumeState:
    """What a resume reads from a complete checkpoint.

    Attributes:
        checkpoint: the checkpoint folder (``checkpoint-N``).
        run: the main process's :data:`STATE_FILE` (step, processes, metrics offset, config,
            reference policy, provenance).
        rank: this process's state file (channels, shaping, env bookkeeping).
    """

    checkpoint: Path
    run: dict[str, Any]
    rank: dict[str, Any]

    @property
    def step(self) -> int:
        """The optimiser step the checkpoint was taken after."""
        return int(self.run["global_step"])


def load_resume_state(checkpoint: Path, process_index: int, world_size: int, config: Mapping[str, Any],
                      initial_fingerprint: str) -> ResumeState:
    """Read and check a complete checkpoint for this process.

    Args:
        checkpoint: a complete checkpoint (:func:`resume_checkpoint`).
        process_index, world_size: this process and the number of processes.
        config: the resumed run's config (plain JSON data); a training difference from the
            checkpoint's is logged (a warning naming the keys), not refused.
        initial_fingerprint: :func:`~trainer_client.model.fingerprint.weights_fingerprint` of the initial policy just loaded (the
            reference policy trace replay and the KL term compare against).

    Raises:
        ResumeError: another number of processes (each kept its own pairs and random streams),
            or another initial policy (the stored pairs' reference log-probs would be wrong).
    """
    run = json.loads((checkpoint / STATE_FILE).read_text())
    if run["world_size"] != world_size:
        raise ResumeError(f"{checkpoint} was taken with {run['world_size']} training process(es), this run has "
                          f"{world_size}: resume with the same number (each process keeps its own replay pairs and "
                          "random streams)")
    reference = run["reference_policy"]
    if reference["weights_fingerprint"] != initial_fingerprint:
        raise ResumeError(f"the initial policy ({config.get('model')}) is not the one {checkpoint} was trained from "
                          f"({reference['model']}; weights fingerprint {reference['weights_fingerprint'][:12]} vs "
                          f"{initial_fingerprint[:12]}): the reference policy of the run would change")
    saved = run["config"]
    changed = sorted(k for k in set(saved) | set(config)
                     if k not in RESUME_FREE_KEYS and saved.get(k) != config.get(k))
    if changed:
        log.warning("resuming %s with settings that differ from the checkpoint's: %s (the resumed run is not the "
                    "run that was checkpointed)", checkpoint, ", ".join(changed))
    rank = json.loads((checkpoint / RANK_DIR / f"rank{process_index}.json").read_text())
    return ResumeState(checkpoint, run, rank)


def restore_trainer_state(trainer: Any, state: ResumeState) -> None:
    """Put the channels' and the shaping strategy's state back (after the trainer is built,
    before ``train``).

    Raises:
        ResumeError: a channel of the checkpoint is not in this trainer, or the other way round.
    """
    channels = state.rank["channels"]
    names = channel_keys(trainer.channels)
    if sorted(channels) != sorted(names):
        raise ResumeError(f"the checkpoint's loss channels ({', '.join(sorted(channels)) or 'none'}) are not this "
                          f"run's ({', '.join(sorted(names)) or 'none'})")
    for key, channel in zip(names, trainer.channels, strict=True):
        channel.load_state_dict(channels[key])
    trainer.shaping_strategy.load_state_dict(state.rank["shaping"]["state"])


def final_model_from_checkpoint(checkpoint: Path, final: Path) -> None:
    """``final/`` of a run whose last checkpoint is its last step (it died after saving it and
    before writing ``final/``): the checkpoint's model, config and tokenizer files, without the
    training state."""
    import shutil

    shutil.copytree(checkpoint, final, ignore=shutil.ignore_patterns(
        "optimizer.pt", "scheduler.pt", "rng_state*.pth", "trainer_state.json", "training_args.bin", STATE_FILE,
        RANK_DIR, ".*.tmp"))


def channel_keys(channels: Sequence[Any]) -> list[str]:
    """Each loss channel's key in a checkpoint, in order: its registered name (or its class),
    with ``#<position>`` added to a name an earlier channel already has (two ``channels``
    entries may share a name, e.g. one per role: one key each, so neither state overwrites the
    other's)."""
    keys: list[str] = []
    for i, channel in enumerate(channels):
        name = channel.name or f"{type(channel).__module__}:{type(channel).__qualname__}"
        keys.append(name if name not in keys else f"{name}#{i}")
    return keys


class CheckpointStateCallback(TrainerCallback):
    """Writes our state into every checkpoint transformers saves (see the module docstring).

    Args:
        trainer: the ``DebateGRPOTrainer`` (its channels, strategy, environments, accelerator).
        run_state: the main process's fixed part of :data:`STATE_FILE` (``config``,
            ``config_sha256``, ``reference_policy``, ``provenance``).
        metrics_path: the run's ``metrics.jsonl`` (its size at the save is the resume point).
        env_state: returns the env-side bookkeeping of this process (JSON data).
    """

    def __init__(self, trainer: Any, run_state: dict[str, Any], metrics_path: Path,
                 env_state: Callable[[], dict[str, Any]]) -> None:
        self.trainer = trainer
        self.run_state = run_state
        self.metrics_path = metrics_path
        self.env_state = env_state

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        trainer = self.trainer
        start = time.perf_counter()
        checkpoint = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        ranks = checkpoint / RANK_DIR
        ranks.mkdir(parents=True, exist_ok=True)
        environments = trainer.batch_environments() or []
        rank_state = {
            "format": FORMAT, "global_step": state.global_step, "process_index": args.process_index,
            "channels": dict(zip(channel_keys(trainer.channels), (c.state_dict() for c in trainer.channels), strict=True)),
            "shaping": {"name": trainer.shaping_strategy.name, "state": trainer.shaping_strategy.state_dict()},
            "env": {**self.env_state(),
                    "last_batch_episodes": [env.trace.record.episode_id for env in environments
                                            if env.trace.record is not None]},
        }
        write_json_atomic(ranks / f"rank{args.process_index}.json", rank_state, indent=1)
        trainer.accelerator.wait_for_everyone()  # every process's file is there before the marker
        if state.is_world_process_zero:
            size = self.metrics_path.stat().st_size if self.metrics_path.exists() else 0
            write_json_atomic(checkpoint / STATE_FILE, {
                "format": FORMAT, "global_step": state.global_step, "world_size": args.world_size,
                "ranks": [f"{RANK_DIR}/rank{r}.json" for r in range(args.world_size)],
                "metrics": {"path": str(self.metrics_path), "offset": size},
                "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                **self.run_state,
            }, indent=1)
            log.info("checkpoint %s complete (our state: %.2f s)", checkpoint, time.perf_counter() - start)
        trainer.accelerator.wait_for_everyone()
