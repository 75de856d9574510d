"""The generator-verifier gap of a starting policy, on validation problems (issue 54).

For each model: greedy debates and ``k`` sampled debates (temperature ``--temperature``) on the
first ``--problems`` validation problems of its family, and from each set of debates

- the solver's first-answer accuracy ``p``;
- the verifier's accept rate on right first answers ``a`` and reject rate on wrong ones ``r``,
  its balanced accuracy ``(a + r) / 2`` and the missing-verdict share;
- the gap as arXiv 2412.02674 measures it, the precision of the model's own verification over its
  generation (:func:`trainer_client.credit.verdicts.verification_gap`: ``P(right | accepted) − p``;
  0: accepting tells nothing about being right);
- the share of sampled debates whose verdict is right, against greedy's: how much better a check
  the samples hold than greedy gives (what outcome RL can select).

Example::

    python scripts/verifier_gap.py tiny-sums /work/exp/div/build1/tiny-model --problems 118 --json gap.json

A model is a tiny model's name (its committed build) or a folder with a ``tiny_model.json``.
Prints one line per model and evaluation, then writes every figure with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", help="tiny model names or built folders")
    parser.add_argument("--problems", type=int, default=118, help="validation problems (the first N)")
    parser.add_argument("--k", type=int, default=8, help="sampled debates per problem")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from env_server.debate.problems import load_problem_source
    from env_server.debate.problems.splits import HELDOUT_SEED_BASE, VALIDATION_SEED_BASE
    from trainer_client.credit.verdicts import verification_gap
    from trainer_client.evaluation.episode_eval import evaluate_episodes
    from trainer_client.evaluation.heldout import heldout_seeds
    from trainer_client.tiny_models.build import tiny_model_path

    out: list[dict[str, Any]] = []
    seeds = heldout_seeds(args.problems, start=VALIDATION_SEED_BASE - HELDOUT_SEED_BASE)
    for name in args.models:
        path = Path(name) if Path(name).is_dir() else tiny_model_path(name, Path("outputs"))
        marker = json.loads((path / "tiny_model.json").read_text())
        source = load_problem_source(f"gen:{marker['spec']['family']}")
        model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
        row: dict[str, Any] = {"model": name, "fingerprint": marker.get("fingerprint"),
                               "family": marker["spec"]["family"], "problems": args.problems}
        for label, k in (("greedy", 0), ("sampled", args.k)):
            report = evaluate_episodes(model, tokenizer, source, seeds, k=k, temperature=args.temperature,
                                       max_new_tokens=256)
            figures = report.summary()
            figures["gap"] = verification_gap(report.first_answer_accuracy, report.verdict_accuracy_right,
                                 report.verdict_accuracy_wrong)
            row[label] = figures
            print(f"{name} {label}: first answer {report.first_answer_accuracy:.3f}, balanced verdict "
                  f"{report.balanced_verdict_accuracy}, accept right {report.verdict_accuracy_right}, reject wrong "
                  f"{report.verdict_accuracy_wrong}, missing {report.missing_verdict_share}, gap {figures['gap']}, "
                  f"final {report.judge_accuracy}", flush=True)
        out.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
