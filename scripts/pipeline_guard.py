"""The reward pipeline's identity guard: a 3-step tiny run, recorded at the trainer's TRL hook.

``capture OUT`` trains 3 steps of the pinned ``tiny-sums`` start on ``gen:two_digit_sum``
(``own_outcome`` credit, hint distillation on with SRPO routing, so a channel takes tokens
away from GRPO's mask; trace replay stays off: its teachers answer on threads, so whether a
pair is ready at a step depends on timing, and the losses would not repeat) and writes ``OUT/run.json``: per step, what the
batch's loss sees (the ``(B, T)`` advantages and loss mask written into TRL's batch,
``num_items_in_batch``) and the step's logged losses. ``compare A B`` says whether two captures
are identical (``torch.equal`` on every tensor, ``==`` on every loss); run ``capture`` before and
after a change of the pipeline, on one machine, and compare.

``--inputs FILE`` also stores what the pipeline was given (the graded records, the completion
segments, TRL's masks, the channels' routes, GiGPO's step inputs) with what it returned: the
test data of ``tests/trainer_client/credit/test_pipeline_guard.py``, which feeds them to the
pipeline without training.

Usage::

    OMP_NUM_THREADS=1 python scripts/pipeline_guard.py capture /tmp/guard-before --inputs tests/.../pipeline_guard.json.gz
    OMP_NUM_THREADS=1 python scripts/pipeline_guard.py capture /tmp/guard-after
    python scripts/pipeline_guard.py compare /tmp/guard-before /tmp/guard-after
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STEPS = 3


def _segments_json(segments: Any) -> Any:
    if segments is None:
        return None
    return [[s.start, s.end, None if s.owner is None else [s.owner.t, str(s.owner.role.value), s.owner.produced]]
            for s in segments]


def capture(out: Path, inputs_path: Path | None) -> None:
    import trainer_client.trainer as trainer_module
    from env_server.cli import running_server
    from trainer_client.config import load_config
    from trainer_client.credit.shaping import RewardShapingConfig
    from trainer_client.tiny_models.build import tiny_model_path
    from trainer_client.tiny_models.run_recipe import tiny_run_settings
    from trainer_client.training.train import run_training

    out.mkdir(parents=True, exist_ok=True)
    steps: list[dict[str, Any]] = []
    inputs: list[dict[str, Any]] = []
    original = trainer_module.DebateGRPOTrainer.on_scored_batch

    def on_scored_batch(self: Any, batch_inputs: Any, output: dict[str, Any]) -> dict[str, Any]:
        trl_completion = output["completion_mask"].clone()
        trl_tool = None if output.get("tool_mask") is None else output["tool_mask"].clone()
        seen: dict[str, Any] = {}
        wrapped_ba = trainer_module.batch_advantages

        def batch_advantages(*args: Any, **kwargs: Any) -> Any:
            seen["args"], seen["kwargs"] = args, kwargs
            return wrapped_ba(*args, **kwargs)

        routes: list[Any] = []
        prepares = []
        for channel in self.channels:
            prepare = channel.prepare

            def recorded(batch: Any, _prepare: Any = prepare) -> Any:
                routed = _prepare(batch)
                routes.append(None if routed is None else routed.clone().tolist())
                return routed

            prepares.append((channel, prepare))
            channel.prepare = recorded
        trainer_module.batch_advantages = batch_advantages
        try:
            result = original(self, batch_inputs, output)
        finally:
            trainer_module.batch_advantages = wrapped_ba
            for channel, prepare in prepares:
                channel.prepare = prepare
        steps.append({"advantages": result["advantages"].tolist(), "loss_mask": result["tool_mask"].tolist(),  # trl 1.16
                      "num_items_in_batch": float(result["num_items_in_batch"])})
        if inputs_path is not None:
            from trainer_client.credit.gigpo import GiGPOInputs
            from trainer_client.credit.step_credit import gigpo_steps

            args, kwargs = seen["args"], seen["kwargs"]
            all_records, num_generations, _strategy, segments, width, first = args
            environments = self.batch_environments()
            local, _ = gigpo_steps(all_records, [env.trace.turns for env in environments], self._batch_completions,
                                   None, self.gigpo.step_reward_default, self.gigpo.gamma)
            variants = {}  # the other estimators on the same batch, as the pipeline gave them
            for name, extra in (("grpo_turn", {"estimator": "grpo_turn"}),
                                ("gigpo", {"estimator": "gigpo",
                                           "gigpo": GiGPOInputs([r for r, _ in local], [o for _, o in local],
                                                                omega=1.0, gamma=self.gigpo.gamma)})):
                other = wrapped_ba(*args, **{**kwargs, "gigpo": None, **extra})
                variants[name] = {"advantages": other.advantages.tolist(), "loss_mask": other.loss_mask.tolist()}
            inputs.append({
                "records": [r.model_dump(mode="json") for r in all_records],
                "unfinished": [any(t.source == "forfeit" for t in env.trace.turns) for env in environments],
                "num_generations": num_generations, "completion_length": width, "first_rollout": first,
                "segments": [_segments_json(s) for s in segments],
                "trl_completion_mask": trl_completion.tolist(),
                "trl_tool_mask": None if trl_tool is None else trl_tool.tolist(),
                "channel_routes": routes,
                "gigpo_steps": [[rewards, observations] for rewards, observations in local],
                "expected": steps[-1], "variants": variants,
            })
        return result

    trainer_module.DebateGRPOTrainer.on_scored_batch = on_scored_batch
    with running_server(["--grading-workers", "1", "--problems", "gen:two_digit_sum"]) as url:
        settings = {**tiny_run_settings("tiny-sums"), "max_steps": STEPS, "per_device_train_batch_size": 16,
                    "num_generations": 8}
        config = load_config(None, "sdpo", {
            **settings, "model": str(tiny_model_path("tiny-sums", out)), "env_url": url, "output_dir": str(out / "run"),
            "max_rounds": 1, "seed": 7, "problems": "gen:two_digit_sum",
            "sdpo.route": True})
        config = config.model_copy(update={"reward_shaping": RewardShapingConfig(strategy="own_outcome")})
        run_training(config, progress=False)
    trainer_module.DebateGRPOTrainer.on_scored_batch = original
    metrics = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    losses = [{k: v for k, v in m.items() if k.startswith("loss/")} for m in metrics if "loss/total" in m]
    (out / "run.json").write_text(json.dumps({"steps": steps, "losses": losses}))
    if inputs_path is not None:
        inputs_path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(inputs_path, "wt") as fh:
            json.dump({"shaping": "own_outcome", "steps": inputs}, fh)
    print(f"captured {len(steps)} steps, losses {losses}")


def compare(a: Path, b: Path) -> int:
    import torch

    left, right = (json.loads((p / "run.json").read_text()) for p in (a, b))
    ok = len(left["steps"]) == len(right["steps"]) == STEPS
    for k, (x, y) in enumerate(zip(left["steps"], right["steps"], strict=True)):
        for key in ("advantages", "loss_mask"):
            same = torch.equal(torch.tensor(x[key]), torch.tensor(y[key]))
            print(f"step {k + 1} {key}: {'identical' if same else 'DIFFERENT'}")
            ok &= same
        same = x["num_items_in_batch"] == y["num_items_in_batch"]
        print(f"step {k + 1} num_items_in_batch: {'identical' if same else 'DIFFERENT'}")
        ok &= same
    for k, (x, y) in enumerate(zip(left["losses"], right["losses"], strict=True)):
        same = x == y
        print(f"step {k + 1} losses: {'identical' if same else 'DIFFERENT'} {x}" + ("" if same else f" vs {y}"))
        ok &= same
    print("IDENTICAL" if ok else "DIFFERENT")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cap = sub.add_parser("capture")
    cap.add_argument("out", type=Path)
    cap.add_argument("--inputs", type=Path, default=None)
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("a", type=Path)
    cmp_.add_argument("b", type=Path)
    args = parser.parse_args()
    if args.command == "capture":
        capture(args.out, args.inputs)
        return 0
    return compare(args.a, args.b)


if __name__ == "__main__":
    raise SystemExit(main())
