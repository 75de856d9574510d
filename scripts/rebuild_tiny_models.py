"""Rebuild a tiny model from its recipe and compare it with its committed build; measure a start.

The protocol's starting policies are committed builds (``trainer_client/tiny_models/pinned/``):
the warm-up's floating-point sums depend on the torch thread count and the CPU, so a rebuild may
land elsewhere. This script (not run in CI: a build takes minutes) rebuilds a model from its
recipe (``build_tiny_model(..., pinned=False)``), prints the weights fingerprint and greedy
first-answer accuracy on validation problems of the rebuild and of the committed build, and can

- ``--commit``: write the rebuild into the committed store (what a maintainer runs when a recipe
  changes; the old folder is replaced);
- ``--figures FILE``: measure the committed (or, with ``--rebuilt``, the rebuilt) model as a
  starting policy (every figure ``mathdebate ablate`` reports, in debate and single mode, plus
  the hint probe) on validation problems and write them as JSON.

Examples::

    python scripts/rebuild_tiny_models.py tiny-sums --threads 1
    python scripts/rebuild_tiny_models.py tiny-sums --threads 2 --commit
    python scripts/rebuild_tiny_models.py tiny-sums --figures docs/ablation/start/figures.json --skip-rebuild

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _accuracy(path: Path, problems: int) -> float:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from env_server.debate.problems import load_problem_source
    from env_server.debate.problems.splits import HELDOUT_SEED_BASE, VALIDATION_SEED_BASE
    from trainer_client.evaluation.heldout import evaluate_first_answers, heldout_seeds
    from trainer_client.tiny_models.run_recipe import TINY_FAMILIES

    spec = json.loads((path / "tiny_model.json").read_text())["spec"]
    family = f"gen:{spec['family']}" if spec.get("family") else TINY_FAMILIES.get("tiny")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    seeds = heldout_seeds(problems, start=VALIDATION_SEED_BASE - HELDOUT_SEED_BASE)
    return evaluate_first_answers(model, tokenizer, load_problem_source(family), seeds).accuracy


def start_figures(path: Path, problems: int, k: int, temperature: float) -> dict[str, Any]:
    """Every figure of the model at ``path`` as a starting policy on ``problems`` validation
    problems: :func:`~trainer_client.evaluation.policy_eval.evaluate_policy` in debate and in
    single mode (``k`` samples at ``temperature``), and the hint probe."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from env_server.debate.problems import load_problem_source
    from env_server.debate.problems.splits import HELDOUT_SEED_BASE, VALIDATION_SEED_BASE
    from trainer_client.ablation.hint_probe import probe_hints
    from trainer_client.config import TrainConfig
    from trainer_client.evaluation.heldout import heldout_seeds
    from trainer_client.evaluation.policy_eval import evaluate_policy

    spec = json.loads((path / "tiny_model.json").read_text())["spec"]
    source = load_problem_source(f"gen:{spec['family']}")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    seeds = heldout_seeds(problems, start=VALIDATION_SEED_BASE - HELDOUT_SEED_BASE)
    sdpo = TrainConfig().sdpo
    figures: dict[str, Any] = {"problems": problems, "split": "validation", "k": k, "temperature": temperature}
    for mode in ("debate", "single"):
        evaluation = evaluate_policy(model, tokenizer, source, seeds, k=k, temperature=temperature, mode=mode)
        figures[mode] = evaluation.figures
    figures["hint_probe"] = probe_hints(model, tokenizer, source, seeds, style=sdpo.hint, restate=sdpo.restate).summary()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="a tiny model name: tiny, tiny-learning, tiny-sums, tiny-div, tiny-sums@1, ...")
    parser.add_argument("--threads", type=int, default=None, help="torch threads for the rebuild (default: torch's)")
    parser.add_argument("--out", default=None, help="where the rebuild goes (default: a temporary folder)")
    parser.add_argument("--problems", type=int, default=200, help="validation problems for the accuracy")
    parser.add_argument("--commit", action="store_true", help="replace the committed build with the rebuild")
    parser.add_argument("--skip-rebuild", action="store_true", help="only measure the committed build")
    parser.add_argument("--figures", default=None, help="write the start's figures (JSON) here")
    parser.add_argument("--rebuilt", action="store_true", help="--figures of the rebuild instead of the committed build")
    parser.add_argument("--k", type=int, default=8, help="samples per problem for the figures")
    parser.add_argument("--temperature", type=float, default=0.7, help="the samples' temperature (the protocol's)")
    args = parser.parse_args(argv)

    import torch

    from trainer_client.tiny_models.build import PINNED_DIR, build_tiny_model, pinned_build
    from trainer_client.tiny_models.recipes import tiny_model_spec

    if args.threads:
        torch.set_num_threads(args.threads)
    spec = tiny_model_spec(args.name)
    committed = pinned_build(spec)
    result: dict[str, Any] = {"name": args.name, "threads": torch.get_num_threads(), "torch": torch.__version__,
                              "committed": str(committed) if committed else None}
    if committed is not None:
        marker = json.loads((committed / "tiny_model.json").read_text())
        result["committed_fingerprint"] = marker.get("fingerprint")
        result["committed_accuracy"] = _accuracy(committed, args.problems)
    rebuilt: Path | None = None
    if not args.skip_rebuild:
        rebuilt = Path(args.out or tempfile.mkdtemp(prefix=f"rebuild-{args.name}-"))
        start = time.perf_counter()
        build_tiny_model(rebuilt, spec, progress=True, pinned=False)
        result["rebuild_seconds"] = round(time.perf_counter() - start, 1)
        result["rebuilt_fingerprint"] = json.loads((rebuilt / "tiny_model.json").read_text())["fingerprint"]
        result["rebuilt_accuracy"] = _accuracy(rebuilt, args.problems)
        result["same_weights"] = result["rebuilt_fingerprint"] == result.get("committed_fingerprint")
        if args.commit:
            target = PINNED_DIR / args.name
            if target.exists():
                shutil.rmtree(target)
            target.mkdir(parents=True)
            from trainer_client.tiny_models.build import BUILD_FILES

            for name in BUILD_FILES:
                if (rebuilt / name).exists():
                    shutil.copyfile(rebuilt / name, target / name)
            result["committed"] = str(target)
    if args.figures:
        source_path = rebuilt if args.rebuilt and rebuilt is not None else committed
        if source_path is None:
            parser.error("--figures: no committed build of this recipe (rebuild with --commit, or pass --rebuilt)")
        figures = start_figures(source_path, args.problems, args.k, args.temperature)
        figures["fingerprint"] = json.loads((source_path / "tiny_model.json").read_text()).get("fingerprint")
        figures["model"] = args.name
        Path(args.figures).parent.mkdir(parents=True, exist_ok=True)
        Path(args.figures).write_text(json.dumps(figures, indent=2))
        result["figures"] = args.figures
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
