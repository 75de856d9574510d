"""Each run's channels' own objectives beside its accuracy, for one or more ablation folders.

Example (issue 56's stage V, ``docs/ablation/channels/protocol-56-validation.md``)::

    python scripts/channel_objectives.py /work/exp/v56-R0 /work/exp/v56-R1 --json objectives.json

Prints one line per finished run (folder, arm, seed): greedy first-answer accuracy on the
ablation's problems, trace replay's last ``margin_above_start`` and the pairs it read, DPO's loss
over the first and last 20 steps, hint distillation's JSD over the first and last 20 steps and
its mean ``teacher_advantage``, and the run's sampled tokens
(:func:`trainer_client.ablation.channel_objectives.channel_objectives`). ``--json FILE`` writes
every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", help="mathdebate ablate --output-dir folders")
    parser.add_argument("--window", type=int, default=20, help="steps in the first and last means")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)

    from trainer_client.ablation.channel_objectives import channel_objectives, read_curve
    from trainer_client.ablation.runs import RESULT_FILE

    rows = []
    for folder in map(Path, args.folders):
        results = sorted(folder.glob(f"runs/*/seed*/{RESULT_FILE}"))
        if not results:
            print(f"channel_objectives: no finished run in {folder}", file=sys.stderr)
            return 2
        for path in results:
            result = json.loads(path.read_text())["result"]
            figures = channel_objectives(read_curve(path.parent / "metrics.jsonl"), args.window)
            rows.append({"folder": str(folder), "arm": path.parent.parent.name, "seed": int(result["seed"]),
                         "accuracy": result["heldout"]["accuracy"], **figures})
    for row in rows:
        parts = [f"{Path(row['folder']).name} {row['arm']} seed {row['seed']}: accuracy {row['accuracy']:.3f}"]
        if row["replay"]:
            replay = row["replay"]
            parts.append(f"margin_above_start {_fmt(replay['margin_above_start'])} on "
                         f"{_fmt(replay['heldout_pairs'], '.0f')} pairs, dpo {_fmt(replay['dpo_loss']['first'])} -> "
                         f"{_fmt(replay['dpo_loss']['last'])}, pairs stored {_fmt(replay['pairs_stored'], '.0f')}")
        if row["sdpo"]:
            jsd, advantage = row["sdpo"]["jsd"], row["sdpo"]["teacher_advantage"]
            parts.append(f"jsd {_fmt(jsd['first'])} -> {_fmt(jsd['last'])}, teacher_advantage "
                         f"{_fmt(advantage['first'])} -> {_fmt(advantage['last'])} (run {_fmt(advantage['run'])})")
        parts.append(f"tokens {row['tokens_sampled']:.0f}")
        print(" | ".join(parts))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
