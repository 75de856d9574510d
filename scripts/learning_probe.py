"""Learning probe: does baseline GRPO against the env server improve the tiny model?

1. build the learning tiny model (``trainer_client.tiny_models.build.learning_spec``, overridable);
2. evaluate greedy first-answer accuracy (and pass@k) on N held-out problems (seeds >= 10**9);
3. run baseline GRPO (identity shaping, sdpo.alpha = replay.beta = 0, max_rounds 1) for the
   given steps against an in-process server serving ``gen:<family>``;
4. evaluate the trained policy on the same held-out problems; print before/after and timings.

Example (the committed recipe)::

    python scripts/learning_probe.py --out outputs/learning-probe --rl-steps 60

Prints one JSON summary line at the end (also written to ``<out>/summary.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


#: Pilot runs evaluate on validation problems (held-out seeds from here up), disjoint from the
#: protocol's held-out set (the first 500 held-out seeds that ``mathdebate ablate`` uses), so that
#: choosing the protocol's settings never looks at the problems its result is measured on.
VALIDATION_START = 500_000  # = env_server.debate.problems.splits.VALIDATION_SEED_BASE - HELDOUT_SEED_BASE


def _evaluate(model_dir: Path, tokenizer_dir: Path, family: str, n: int, k: int) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from env_server.debate.problems import load_problem_source
    from trainer_client.evaluation.heldout import evaluate_first_answers, heldout_seeds

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    source = load_problem_source(f"gen:{family}")
    report = evaluate_first_answers(model, tokenizer, source, heldout_seeds(n, start=VALIDATION_START), k=k)
    return report.summary()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="outputs/learning-probe")
    parser.add_argument("--model", default="tiny-learning", choices=["tiny-learning", "tiny-sums", "tiny-div", "tiny-div-r2"],
                        help="which offline tiny model's spec to build (trainer_client.config.TINY_MODELS)")
    parser.add_argument("--spec", default="{}", help="JSON overrides of learning_spec() (e.g. '{\"sft_steps\": 200}')")
    parser.add_argument("--curve-every", type=int, default=0, help="during the warm-up, evaluate every N steps")
    parser.add_argument("--curve-n", type=int, default=100)
    parser.add_argument("--n-eval", type=int, default=500)
    parser.add_argument("--k", type=int, default=8, help="samples per problem for pass@k at temperature 1 (0: off)")
    parser.add_argument("--rl-steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32, help="per_device_train_batch_size (completions per step)")
    parser.add_argument("--max-completion-length", type=int, default=384)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--dataset-size", type=int, default=1024)
    parser.add_argument("--loss-type", default="dapo")
    parser.add_argument("--no-scale-advantages", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                        help="more trainer config overrides (YAML values)")
    args = parser.parse_args(argv)

    import yaml

    from env_server.cli import running_server
    from trainer_client.config import TINY_MODELS, load_config
    from trainer_client.tiny_models import recipes
    from trainer_client.tiny_models.build import build_tiny_model
    from trainer_client.tiny_models.recipes import TinyModelSpec
    from trainer_client.training.reporting import read_metrics
    from trainer_client.training.train import run_training

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    spec = TinyModelSpec(getattr(recipes, TINY_MODELS[args.model])(), **json.loads(args.spec))
    family = spec["family"]
    summary: dict[str, Any] = {"spec": spec}

    curve: list[dict[str, Any]] = []
    monitor = None
    if args.curve_every:
        from env_server.debate.problems import load_problem_source
        from trainer_client.evaluation.heldout import evaluate_first_answers, heldout_seeds

        source = load_problem_source(f"gen:{family}")

        def monitor(step: int, model: Any, tokenizer: Any) -> None:
            if step % args.curve_every == 0:
                validation = heldout_seeds(args.curve_n, start=VALIDATION_START)
                report = evaluate_first_answers(model, tokenizer, source, validation, k=4)
                point = {"step": step, **{key: report.summary()[key] for key in
                                          ("accuracy", "valid_rate", "pass_at_k", "sample_accuracy")}}
                curve.append(point)
                print("warm-up curve", json.dumps(point), flush=True)

    start = time.perf_counter()
    model_dir = build_tiny_model(out / "tiny-model", spec, progress=True, monitor=monitor)
    summary["build_s"] = round(time.perf_counter() - start, 1)
    summary["warmup_curve"] = curve

    before = _evaluate(model_dir, model_dir, family, args.n_eval, args.k)
    summary["before"] = before
    print("before", json.dumps(before), flush=True)

    if args.rl_steps:
        overrides: dict[str, Any] = {
            "model": str(model_dir), "output_dir": str(out / "grpo"), "max_steps": args.rl_steps,
            "learning_rate": args.lr, "num_generations": args.num_generations,
            "per_device_train_batch_size": args.batch, "max_completion_length": args.max_completion_length,
            "temperature": args.temperature, "dataset_size": args.dataset_size, "loss_type": args.loss_type,
            "scale_advantages": not args.no_scale_advantages, "max_rounds": 1, "seed": args.seed,
            "logging_steps": 1, "problems": f"gen:{family}",
        }
        for pair in args.override:
            key, _, value = pair.partition("=")
            overrides[key] = yaml.safe_load(value)
        with running_server(["--grading-workers", "1", "--problems", f"gen:{family}"]) as url:
            config = load_config(None, "baseline", {**overrides, "env_url": url})
            assert config.sdpo.alpha == 0 and config.replay.beta == 0 and config.reward_shaping.strategy in (None, "identity")
            start = time.perf_counter()
            run_training(config, progress=False)
            rl_s = time.perf_counter() - start
        summary["rl"] = {"steps": args.rl_steps, "wall_s": round(rl_s, 1), "s_per_step": round(rl_s / args.rl_steps, 2),
                         "config": config.model_dump(mode="json")}
        metrics = read_metrics(out / "grpo" / "metrics.jsonl")
        summary["rl"]["reward_solver"] = [m.get("debate/reward/solver") for m in metrics]
        after = _evaluate(out / "grpo" / "final", model_dir, family, args.n_eval, args.k)
        summary["after"] = after
        print("after", json.dumps(after), flush=True)
        summary["gain_points"] = round(100 * (after["accuracy"] - before["accuracy"]), 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: summary.get(k) for k in ("build_s", "before", "after", "gain_points")}
                     | {"rl_wall_s": summary.get("rl", {}).get("wall_s"),
                        "s_per_step": summary.get("rl", {}).get("s_per_step")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
