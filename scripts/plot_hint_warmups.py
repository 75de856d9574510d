"""Plot the hint-reading warm-up curves of docs/ablation/tiny-sums-validation/hint-warmups.json.

Usage: python scripts/plot_hint_warmups.py [JSON] [PNG]

One panel per measure along the warm-up: greedy accuracy without the hint (solid) and with the
hint for each wrong answer (dashed), and the share of error sites the hint fixes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).resolve().parents[1] / "docs" / "ablation" / "tiny-sums-validation"


def main(argv: list[str]) -> int:
    source = Path(argv[0]) if argv else HERE / "hint-warmups.json"
    target = Path(argv[1]) if len(argv) > 1 else source.with_suffix(".png")
    variants = json.loads(source.read_text())["variants"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    for i, (name, points) in enumerate(variants.items()):
        steps = [p["step"] for p in points]
        color = f"C{i}"
        left.plot(steps, [100 * p["accuracy_unhinted"] for p in points], "-o", color=color, label=name)
        left.plot(steps, [100 * p["accuracy_hinted"] for p in points], "--", color=color)
        right.plot(steps, [100 * p["sites_fixed"] for p in points], "-o", color=color)
    left.set(xlabel="warm-up step", ylabel="greedy first-answer accuracy, % (dashed: hinted)",
             title="validation accuracy without / with the hint")
    right.set(xlabel="warm-up step", ylabel="% of error sites fixed by the hint", title="error sites the hint fixes")
    left.legend(fontsize=7, loc="upper left")
    figure.tight_layout()
    figure.savefig(target, dpi=110)
    print(target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
