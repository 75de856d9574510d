"""The hint probe, per site: at every error site of a model's first solver turn on validation
problems, the correct turn's per-token log-probability under the student (no hint) and under the
teacher hint distillation would use (the same model shown the hint), and their difference, the
teacher's advantage (issue 56's audit: SDPO teaches only where it is > 0).

    python scripts/hint_probe.py MODEL [--problems gen:two_digit_sum] [--n 200] \\
        [--style template|localised|reference] [--restate] [--out sites.jsonl]

``MODEL``: a tiny model name (``tiny-sums``, ...) or a model folder (a run's ``final/``).
Problems: the validation split (``VALIDATION_SEED_BASE + i``), never the held-out one; default:
the tiny model's own family, else ``--problems``. Prints the probe's figures and the spread of the
teacher's advantage over the sites; ``--out`` gets one JSON line per site
(:class:`trainer_client.ablation.hint_probe.HintProbe`'s ``per_site``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a tiny model name or a model folder")
    parser.add_argument("--problems", default=None, help="problem source (default: the tiny model's family)")
    parser.add_argument("--n", type=int, default=200, help="validation problems probed")
    parser.add_argument("--style", choices=("template", "localised", "reference"), default="template",
                        help="the hint: the template, the localised hint where the family has one, the reference")
    parser.add_argument("--restate", action="store_true", help="the hint ends with the solver's instructions")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="greedy answer length")
    parser.add_argument("--out", default=None, help="write one JSON line per error site here")
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from env_server.debate.problems import load_problem_source
    from env_server.debate.problems.splits import HELDOUT_SEED_BASE, VALIDATION_SEED_BASE
    from trainer_client.ablation.hint_probe import probe_hints
    from trainer_client.evaluation.heldout import heldout_seeds
    from trainer_client.tiny_models.build import tiny_model_path
    from trainer_client.tiny_models.recipes import is_tiny_model_name
    from trainer_client.tiny_models.run_recipe import TINY_FAMILIES

    tiny = is_tiny_model_name(args.model)
    path = tiny_model_path(args.model, Path("outputs")) if tiny else Path(args.model)
    family = json.loads((path / "tiny_model.json").read_text())["spec"].get("family") if tiny else None
    problems = args.problems or (f"gen:{family}" if family else TINY_FAMILIES.get("tiny") if tiny else None)
    if problems is None:
        parser.error("--problems is needed for a model that is not a tiny model")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    seeds = heldout_seeds(args.n, start=VALIDATION_SEED_BASE - HELDOUT_SEED_BASE)
    probe = probe_hints(model, tokenizer, load_problem_source(problems), seeds, style=args.style,
                        restate=args.restate, max_new_tokens=args.max_new_tokens)
    print(json.dumps(probe.summary(), indent=2))
    for key, what in (("teacher_advantage", "per token of the correct turn"),
                      ("teacher_advantage_right_token", "at the right token, where the student leaves the correct turn")):
        values = [site[key] for site in probe.per_site if site[key] is not None]
        if values:
            q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
            print(f"teacher minus student log-prob {what}, {len(values)} error sites (nats): mean "
                  f"{statistics.fmean(values):+.3f}, quartiles {q[0]:+.3f} / {q[1]:+.3f} / {q[2]:+.3f}, "
                  f"> 0 at {100 * sum(v > 0 for v in values) / len(values):.0f}% of sites")
    if args.out:
        Path(args.out).write_text("".join(json.dumps(site) + "\n" for site in probe.per_site))
        print(f"per site: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
