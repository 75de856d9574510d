"""Compare one arm of two ablation folders, paired by seed and held-out problem.

Example (the per-role policies experiment, ``docs/ablation/policies/protocol.md``)::

    python scripts/compare_ablations.py outputs/policies/per-role outputs/policies/shared --arm baseline

Prints the difference (first − second) in held-out first-answer accuracy as percentage points
with 95% intervals over seeds and over problems, each side's accuracy per seed, per-role rewards
and RL time; ``--json FILE`` writes the figures (``compare_ablations``'s dict).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--arm", default="baseline")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)

    from trainer_client.ablation.compare_runs import compare_ablations

    try:
        result = compare_ablations(args.first, args.second, args.arm)
    except (ValueError, FileNotFoundError) as exc:
        print(f"compare_ablations: {exc}", file=sys.stderr)
        return 2
    d = result["difference"]
    print(f"arm {result['arm']}, seeds {result['seeds']}: first - second = {100 * d['by_seed'][0]:+.1f} points "
          f"(95% over seeds [{100 * d['by_seed'][1]:+.1f}, {100 * d['by_seed'][2]:+.1f}], "
          f"over problems [{100 * d['by_problem'][1]:+.1f}, {100 * d['by_problem'][2]:+.1f}])")
    for name, side in result["sides"].items():
        means = ", ".join(f"{k} {v:.3f}" for k, v in side["means"].items())
        print(f"  {name}: accuracy by seed {[round(a, 3) for a in side['accuracy_by_seed']]}, "
              f"RL seconds {[round(s) for s in side['rl_seconds']]}, {means}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
