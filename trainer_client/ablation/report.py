"""The ablation's report: ``summary.json``, ``report.md`` and ``report.png`` of ``mathdebate ablate``.

Per arm, every accuracy before and after training (means over seeds) with seed-level and
problem-level paired intervals (:mod:`trainer_client.ablation.stats`), the debate's own
figures, the loss channels' factorial contrasts, the answer-only controls and the hint probe.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainer_client.training.reporting import SMOOTHING_STEPS, trailing_mean

__all__ = ["channel_effects", "write_ablation_report"]


def write_ablation_report(out: Path, protocol: dict[str, Any],
                          befores: Mapping[str, tuple[dict[str, Any], Mapping[str, list[float]] | list[bool]]],
                          results: list[Any], controls: dict[str, dict[str, Any]],
                          provenance: dict[str, Any] | None = None) -> None:
    """Write ``summary.json``, ``report.md`` and ``report.png`` of a ``mathdebate ablate`` run.

    Args:
        out: the output directory.
        protocol: the fixed settings (model, problems, held-out size, seeds, steps, ...).
        befores: per episode mode (``debate`` first), the starting policy's held-out figures
            in that mode (:meth:`HeldoutReport.summary
            <trainer_client.evaluation.heldout.HeldoutReport.summary>`, plus ``episode_reward`` and
            ``finished_rate`` of :func:`~trainer_client.evaluation.episode_eval.evaluate_episodes` when
            measured) and its per-problem vectors (``{metric: (N,) floats}``,
            :attr:`~trainer_client.evaluation.policy_eval.PolicyEvaluation.per_problem`; a bare
            ``(N,)`` bool list is the greedy accuracy's). Each arm is compared with the
            starting policy in its own mode (a run's ``mode``).
        results: :class:`~trainer_client.ablation.ablate.RunResult` per (arm, seed), controls included.
        controls: the answer-only controls (:func:`~trainer_client.ablation.ablate.static_controls`).
        provenance: the ablation's provenance (:func:`env_server.provenance.provenance`), kept
            as ``summary.json``'s ``provenance`` (each run's own is in its ``provenance.json``).

    Raises:
        KeyError: a run's mode has no starting-policy figures in ``befores``.
    """
    from trainer_client.ablation.debate_vs_single import EFFECT_NAME, debate_vs_single
    from trainer_client.ablation.stats import mean_interval, paired_gain
    from trainer_client.evaluation.policy_eval import ACCURACY_METRICS

    arms: dict[str, list[Any]] = {}
    for result in results:
        arms.setdefault(result.arm, []).append(result)
    first_mode = next(iter(befores))
    summary: dict[str, Any] = {"protocol": protocol, "before": befores[first_mode][0], "controls": controls,
                               "arms": {}, "provenance": provenance}
    if len(befores) > 1:
        summary["before_by_mode"] = {mode: figures for mode, (figures, _) in befores.items()}
    for name, runs in arms.items():
        mode = runs[0].mode
        b, before_vectors = befores[mode]
        entry: dict[str, Any] = {"mode": mode, "seeds": [r.seed for r in runs]}
        for metric in ACCURACY_METRICS:
            entry.update(_metric_entry(metric, b, _vectors(before_vectors), runs))
        gain = paired_gain(_vectors(before_vectors)["accuracy"], [r.correct for r in runs])
        after = {key: mean_interval([r.heldout[key] for r in runs]).mean
                 for key in ("valid_rate", "accuracy_valid", "episode_reward", "finished_rate", *_DEBATE_FIGURES)
                 if runs[0].heldout.get(key) is not None and all(r.heldout.get(key) is not None for r in runs)}
        entry.update({
            "gain_by_seed_ci95": [gain.by_seed.low, gain.by_seed.high],
            "gain_by_problem_ci95": [gain.by_problem.low, gain.by_problem.high],
            "valid_rate_after": after.get("valid_rate"),
            "accuracy_valid_after": after.get("accuracy_valid"),
            "valid_rate_before": b.get("valid_rate"),
            "episode_reward_before": b.get("episode_reward"),
            "episode_reward_after": after.get("episode_reward"),
            "finished_rate_after": after.get("finished_rate"),
            "debate_before": {key: b.get(key) for key in _DEBATE_FIGURES},
            "debate_after": {key: after.get(key) for key in _DEBATE_FIGURES},
            "rl_seconds": [r.rl_seconds for r in runs],
            # per seed, the tokens the run's policy sampled in training (the compute arms are compared at)
            "tokens_sampled": [sum(line.get("tokens/sampled", 0.0) for line in r.curve) for r in runs],
            # per seed, what one held-out answer or debate costs at inference (generated tokens, means)
            "inference_tokens_after": {key: [r.heldout.get(key) for r in runs]
                                       for key in ("first_answer_tokens", "sample_tokens", "debate_tokens")},
            "majority_accuracy_by_k_after": [r.heldout.get("majority_accuracy_by_k") for r in runs],
            "steps": [r.steps for r in runs],
            "gold_supervised": any(r.gold_supervised for r in runs),
            "pairs_stored": [r.pairs_stored for r in runs],
            "replay_by_seed": [r.replay for r in runs],
            "reused_by_seed": [r.reused for r in runs],
            "run_means": {k: sum(r.means.get(k, 0.0) for r in runs) / len(runs) for k in runs[0].means},
        })
        summary["arms"][name] = entry
    summary["effects"] = channel_effects(arms)
    summary["debate_vs_single"] = debate_vs_single(arms)
    for name, pair in summary["debate_vs_single"].items():  # the headline effect beside the channels'
        label = EFFECT_NAME if name == "baseline+own_outcome" or name == "baseline" else f"{EFFECT_NAME} [{name}]"
        summary["effects"][label] = {"mean": pair["mean"], "by_seed_ci95": pair["by_seed_ci95"], "by_problem_ci95": None,
                                     "seeds": pair["seeds"], "sampled": None, "equal_tokens": pair["equal_tokens"]}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    _ablation_plot(out / "report.png", arms, befores[first_mode][0], controls)
    (out / "report.md").write_text(_ablation_markdown(summary, arms, befores))


#: The debate's own figures, greedy and sampled (:func:`~trainer_client.evaluation.policy_eval.evaluate_policy`).
_DEBATE_FIGURES = tuple(f"{prefix}{key}" for prefix in ("", "sampled_") for key in (
    "balanced_verdict_accuracy", "verdict_accuracy_right", "verdict_accuracy_wrong", "judge_copies_solver",
    "wrong_to_right", "right_to_wrong", "missing_verdict_share", "net_repair_rate", "repair_when_rejected",
    "repair_when_accepted"))


def _vectors(before: Mapping[str, list[float]] | list[bool]) -> Mapping[str, list[float]]:
    """The starting policy's per-problem vectors (a bare list is the greedy accuracy's, as before)."""
    return {"accuracy": [float(x) for x in before]} if isinstance(before, list) else before


def _metric_entry(metric: str, before: dict[str, Any], before_vectors: Mapping[str, list[float]],
                  runs: list[Any]) -> dict[str, Any]:
    """``<metric>_before``, ``<metric>_after`` (mean over seeds), ``<metric>_after_by_seed`` and, where
    every run has the per-problem vector, ``<metric>_gain_by_seed_ci95`` and
    ``<metric>_gain_by_problem_ci95`` (:func:`~trainer_client.ablation.stats.paired_gain`); ``None``
    where the metric was not measured."""
    from trainer_client.ablation.stats import paired_gain

    by_seed = [r.heldout.get(metric) for r in runs]
    measured = all(x is not None for x in by_seed)
    entry: dict[str, Any] = {f"{metric}_before": before.get(metric),
                             f"{metric}_after": sum(by_seed) / len(by_seed) if measured and by_seed else None,
                             f"{metric}_after_by_seed": by_seed if measured else None}
    vectors = [r.correct if metric == "accuracy" else r.per_problem.get(metric) for r in runs]
    if metric in before_vectors and all(v for v in vectors):
        gain = paired_gain(before_vectors[metric], vectors)
        entry[f"{metric}_gain_by_seed_ci95"] = [gain.by_seed.low, gain.by_seed.high]
        entry[f"{metric}_gain_by_problem_ci95"] = [gain.by_problem.low, gain.by_problem.high]
    return entry


def channel_effects(arms: dict[str, list[Any]]) -> dict[str, dict[str, Any]]:
    """The loss channels' paired effects on held-out accuracy (:data:`~trainer_client.ablation.stats.CHANNEL_CONTRASTS`,
    :func:`~trainer_client.ablation.stats.contrast`) over the seeds every arm of a contrast
    has, greedy first answer and, where the runs measured it, sampled (avg@k).

    Arms are matched by their preset within each shared suffix of their names (the credit and the
    mode: ``baseline+own_outcome`` against ``sdpo+own_outcome``, the recipe's arms), so a
    factorial under any credit gets its contrasts; a suffix other than none is named in brackets.

    Returns:
        ``{name: {"mean", "by_seed_ci95", "by_problem_ci95", "seeds", "sampled"}}`` (fractions;
        ``sampled`` the same figures for sampled accuracy, or ``None``); contrasts whose arms did
        not all run are left out.
    """
    from trainer_client.ablation.stats import CHANNEL_CONTRASTS, contrast

    groups: dict[str, dict[str, list[Any]]] = {}
    for name, runs in arms.items():
        preset, _, suffix = name.partition("+")
        groups.setdefault(suffix, {})[preset] = runs
    out: dict[str, dict[str, Any]] = {}
    for suffix, by_preset in groups.items():
        for name, weights in CHANNEL_CONTRASTS.items():
            if not all(a in by_preset for a in weights):
                continue
            seeds = sorted(set.intersection(*({r.seed for r in by_preset[a]} for a in weights)))
            if not seeds:
                continue
            run = {a: {r.seed: r for r in by_preset[a]} for a in weights}
            effect = contrast({a: [run[a][s].correct for s in seeds] for a in weights}, weights)
            entry: dict[str, Any] = {"mean": effect.by_seed.mean, "by_seed_ci95": [effect.by_seed.low, effect.by_seed.high],
                                     "by_problem_ci95": [effect.by_problem.low, effect.by_problem.high], "seeds": seeds,
                                     "sampled": None}
            if all((run[a][s].per_problem or {}).get("sampled_accuracy") for a in weights for s in seeds):
                sampled = contrast({a: [run[a][s].per_problem["sampled_accuracy"] for s in seeds] for a in weights}, weights)
                entry["sampled"] = {"mean": sampled.by_seed.mean,
                                    "by_seed_ci95": [sampled.by_seed.low, sampled.by_seed.high],
                                    "by_problem_ci95": [sampled.by_problem.low, sampled.by_problem.high]}
            out[f"{name} ({suffix})" if suffix else name] = entry
    return out


def _control_seeds_note(protocol: dict[str, Any]) -> str:
    """`` (trained controls on the first K)`` when ``--control-seeds`` ran them on fewer seeds."""
    k = protocol.get("control_seeds")
    return "" if k is None or k >= protocol["seeds"] else f" (the trained controls on the first {k})"


def _debate_vs_single_lines(pairs: dict[str, dict[str, Any]]) -> list[str]:
    """The report's section on debate against single-agent training (per seed, then the effect)."""
    if not pairs:
        return []
    lines = ["## Debate against single-agent training, at equal inference tokens", "",
             "The debate's final answer against the single-trained solver's greedy first answer and its majority "
             "vote over as many samples as fit in a debate's inference tokens (`k`; capped at the samples drawn "
             "where marked). Accuracy in percent; tokens sampled in training, debate / single.", "",
             "| debate arm | seed | debate final | single greedy | single majority@k | k | tokens sampled |",
             "|---|---|---|---|---|---|---|"]
    for name, pair in pairs.items():
        for i, seed in enumerate(pair["seeds"]):
            debate, single = pair["tokens_sampled"][i]
            lines.append(f"| {name} | {seed} | {_pct(pair['debate_final_accuracy'][i])} | "
                         f"{_pct(pair['single_accuracy'][i])} | {_pct(pair['single_majority_accuracy'][i])} | "
                         f"{pair['k'][i]}{' (capped)' if pair['k_capped'][i] else ''} | {debate:,.0f} / {single:,.0f} |")
    lines.append("")
    for name, pair in pairs.items():
        low, high = pair["by_seed_ci95"]
        compute = "equal sampled tokens" if pair["equal_tokens"] else "sampled tokens NOT equal (see the table)"
        lines.append(f"- **{name}**: debate final − max(single greedy, single majority) = "
                     f"**{100 * pair['mean']:+.1f}** [{100 * low:+.1f}, {100 * high:+.1f}] points over "
                     f"{len(pair['seeds'])} seeds ({compute}); against the greedy answer alone "
                     f"{100 * pair['vs_greedy']['mean']:+.1f}, against the majority vote alone "
                     f"{100 * pair['vs_majority']['mean']:+.1f}.")
    lines.append("")
    return lines


def _pct(fraction: float | None) -> str:
    """A fraction as a percentage with one decimal, ``-`` when unknown."""
    return "-" if fraction is None else f"{100 * fraction:.1f}"


def _ablation_markdown(summary: dict[str, Any], arms: dict[str, list[Any]],
                       befores: Mapping[str, tuple[dict[str, Any], Mapping[str, list[float]] | list[bool]]]) -> str:
    from trainer_client.ablation.stats import paired_gain

    p = summary["protocol"]
    lines = [
        "# mathdebate ablate: held-out accuracy before and after training", "",
        f"Model `{p['model']}`, problems `{p['problems']}`, {p['heldout_problems']} held-out problems "
        f"(seeds {p['heldout_seeds'][0]}..{p['heldout_seeds'][1]}), {p['seeds']} seeds"
        f"{_control_seeds_note(p)}, {p['max_steps']} steps per run, "
        f"greedy first answer; avg@{p['pass_k']} and pass@{p['pass_k']} at temperature {p.get('temperature', 1.0)}. "
        f"Evaluation: {p['eval_seconds_mean']:.0f} s per "
        "policy (timed apart from training).", "",
        f"Command: `{p['command']}`", "",
        "![report](report.png)", "",
        "## Held-out first-answer accuracy (percent; gains in points with paired 95% intervals)", "",
        "| arm | before | after (mean over seeds) | gain, seed-level CI | gain, problem-level CI | valid before → after "
        "| acc. among valid after | pass@k before → after | episode reward before → after | RL s/seed | s/step "
        "| DPO pairs | error-site rate | gold-supervised |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, arm in summary["arms"].items():
        runs = arms[name]
        gain = paired_gain(_vectors(befores[arm["mode"]][1])["accuracy"], [r.correct for r in runs])
        step_time = arm["run_means"].get("step_time")
        lines.append(
            f"| {name} | {_pct(arm['accuracy_before'])} | {_pct(arm['accuracy_after'])} "
            f"({', '.join(_pct(x) for x in arm['accuracy_after_by_seed'])}) | {gain.by_seed.points()} | "
            f"{gain.by_problem.points()} | {_pct(arm['valid_rate_before'])} → {_pct(arm['valid_rate_after'])} | "
            f"{_pct(arm['accuracy_valid_after'])} | {_pct(arm['pass_at_k_before'])} → {_pct(arm['pass_at_k_after'])} | "
            f"{_pct(arm['episode_reward_before'])} → {_pct(arm['episode_reward_after'])} | "
            f"{sum(arm['rl_seconds']) / len(arm['rl_seconds']):.0f} | "
            f"{'-' if step_time is None else f'{step_time:.2f}'} | {sum(arm['pairs_stored']) / len(runs):.0f} | "
            f"{_pct(arm['run_means'].get('debate/error_site_rate'))} | {'yes' if arm['gold_supervised'] else 'no'} |")
    lines += _accuracy_table(summary)
    if len(befores) > 1:
        lines += ["", "Each arm's *before* is the starting policy evaluated in the arm's own episode mode (the "
                  "solver's prompt differs by mode): " + ", ".join(
                      f"{mode} {_pct(figures['accuracy'])}" for mode, (figures, _) in befores.items()) + "."]
    lines += ["", "Episode reward: greedy whole debates on the same held-out problems (the model plays every role; "
              "`G` by the server's rule; a turn that is not a valid call of its role's tool ends the debate with "
              "forfeits, as in training).", "",
              "`shuffled`: the baseline with episode rewards shuffled within each batch (control). `sft`: supervised "
              "fine-tuning on gold debates of the training problems for the baseline run's wall-clock (control; "
              "gold-supervised by construction).", ""]
    if summary["controls"]:
        lines += ["## Answer-only controls", "", "| control | accuracy |", "|---|---|"]
        for name, control in summary["controls"].items():
            detail = control.get("answer", control.get("which", ""))
            lines.append(f"| {name} ({detail}) | {_pct(control['accuracy'])} |")
        lines.append("")
    if summary.get("effects"):
        lines += ["## Loss-channel effects (held-out accuracy, points; paired 95% intervals)", "",
                  "| contrast | greedy: mean | over seeds | over problems | sampled (avg@k): mean | over seeds | "
                  "over problems | seeds |", "|---|---|---|---|---|---|---|---|"]
        for name, effect in summary["effects"].items():
            cells = []
            for figures in (effect, effect.get("sampled")):
                if figures is None:
                    cells += ["-", "-", "-"]
                    continue
                seed_ci, problem_ci = figures["by_seed_ci95"], figures["by_problem_ci95"]
                cells += [f"{100 * figures['mean']:+.1f}", f"[{100 * seed_ci[0]:+.1f}, {100 * seed_ci[1]:+.1f}]",
                          "-" if problem_ci is None else f"[{100 * problem_ci[0]:+.1f}, {100 * problem_ci[1]:+.1f}]"]
            lines.append(f"| {name} | {' | '.join(cells)} | {len(effect['seeds'])} |")
        lines.append("")
    lines += _debate_vs_single_lines(summary.get("debate_vs_single") or {})
    replay_rows = [(name, figures) for name, arm in summary["arms"].items()
                   for figures in arm.get("replay_by_seed", []) if figures]
    if replay_rows:
        lines += ["## Trace replay: teachers and pairs (per run)", "",
                  "| arm | teacher accuracy | agreement | pair precision | pairs/step | held-out pair accuracy |",
                  "|---|---|---|---|---|---|"]
        for name, figures in replay_rows:
            teachers = ", ".join(f"{t} {_pct(a)}" for t, a in figures["teacher_accuracy"].items())
            lines.append(f"| {name} | {teachers} | {_pct(figures.get('agreement'))} | {_pct(figures.get('pair_precision'))} | "
                         f"{figures.get('pairs_per_step', 0):.2f} | {_pct(figures.get('heldout_pair_accuracy'))} |")
        lines.append("")
    probe = summary["protocol"].get("hint_probe")
    if probe:
        lines += ["## Hint reading of the starting policy (validation problems)", "",
                  f"At {probe['sites']} error sites of {probe['problems']} problems, the hint changes the log-probability "
                  f"of the correct turn by {probe['logp_gain']:+.3f} nats per token (higher at {_pct(probe['share_higher'])}% "
                  f"of the sites); greedy accuracy {_pct(probe['accuracy_unhinted'])} without the hint, "
                  f"{_pct(probe['accuracy_hinted'])} with it"
                  + (f"; the hint fixes {_pct(probe['sites_fixed'])}% of the sites" if "sites_fixed" in probe else "")
                  + (f" (hints: {probe['style']}{', restated' if probe.get('restate') else ''})" if "style" in probe else "")
                  + ".", ""]
    lines += ["## Per-role rewards during training (mean over steps and seeds)", "",
              "| arm | solver | verifier | judge accuracy | episode reward |", "|---|---|---|---|---|"]
    for name, arm in summary["arms"].items():
        m = arm["run_means"]
        lines.append(f"| {name} | {_pct(m.get('debate/reward/solver'))} | {_pct(m.get('debate/reward/verifier'))} | "
                     f"{_pct(m.get('debate/judge_accuracy'))} | {_pct(m.get('debate/episode_reward'))} |")
    return "\n".join(lines) + "\n"


def _accuracy_table(summary: dict[str, Any]) -> list[str]:
    """Every accuracy before → after with its seed-level paired 95% interval, and the debate's own
    figures (greedy / sampled), one row per arm."""
    names = {"accuracy": "greedy first answer", "sampled_accuracy": "sampled first answer (avg@k)",
             "pass_at_k": "pass@k", "final_accuracy": "debate final, greedy",
             "sampled_final_accuracy": "debate final, sampled"}
    lines = ["", "## Every accuracy (percent; gains in points, seed-level paired 95% intervals)", "",
             "| arm | " + " | ".join(names.values()) + " |", "|---|" + "---|" * len(names)]
    for name, arm in summary["arms"].items():
        cells = []
        for metric in names:
            before, after = arm.get(f"{metric}_before"), arm.get(f"{metric}_after")
            ci = arm.get(f"{metric}_gain_by_seed_ci95")
            gain = ("" if before is None or after is None or ci is None else
                    f" ({100 * (after - before):+.1f} [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}])")
            cells.append(f"{_pct(before)} → {_pct(after)}{gain}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    figures = {"balanced_verdict_accuracy": "balanced verdict accuracy", "judge_copies_solver": "judge copies solver",
               "wrong_to_right": "wrong first answer → right final", "right_to_wrong": "right first answer → wrong final"}
    lines += ["", "The debate's own figures (percent of debates; greedy / sampled; before → after):", "",
              "| arm | " + " | ".join(figures.values()) + " |", "|---|" + "---|" * len(figures)]
    for name, arm in summary["arms"].items():
        b, a = arm.get("debate_before", {}), arm.get("debate_after", {})
        lines.append(f"| {name} | " + " | ".join(
            f"{_pct(b.get(key))} / {_pct(b.get('sampled_' + key))} → {_pct(a.get(key))} / {_pct(a.get('sampled_' + key))}"
            for key in figures) + " |")
    return lines


def _ablation_plot(path: Path, arms: dict[str, list[Any]], before: dict[str, Any],
                   controls: dict[str, dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from trainer_client.ablation.stats import mean_interval

    fig, (curve_ax, acc_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, runs in arms.items():
        if name == "sft":
            continue
        steps = sorted({line["step"] for r in runs for line in r.curve if "debate/reward/solver" in line})
        if not steps:
            continue
        # each seed's curve as its trailing mean over SMOOTHING_STEPS (a step holds only a few
        # problems), then the interval over seeds at each step, clipped to the reward's range
        smoothed = []
        for r in runs:
            by_step = {line["step"]: line["debate/reward/solver"] for line in r.curve if "debate/reward/solver" in line}
            seed_steps = [step for step in steps if step in by_step]
            smoothed.append(dict(zip(seed_steps, trailing_mean([by_step[t] for t in seed_steps], SMOOTHING_STEPS),
                                     strict=True)))
        means, lows, highs = [], [], []
        for step in steps:
            interval = mean_interval([curve[step] for curve in smoothed if step in curve])
            means.append(interval.mean)
            lows.append(max(0.0, interval.low))
            highs.append(min(1.0, interval.high))
        curve_ax.plot(steps, means, label=f"{name} ({len(runs)} seed{'s' if len(runs) > 1 else ''})")
        curve_ax.fill_between(steps, lows, highs, alpha=0.2)
    curve_ax.set_xlabel("step")
    curve_ax.set_ylabel(f"solver reward (mean of last {SMOOTHING_STEPS} steps)")
    curve_ax.set_ylim(-0.02, 1.02)
    curve_ax.set_title("training reward: mean and 95% interval over seeds")
    curve_ax.grid(alpha=0.3)
    curve_ax.legend(fontsize=8)

    names = list(arms)
    x = np.arange(len(names))
    afters = [mean_interval([r.heldout["accuracy"] for r in arms[n]]) for n in names]
    acc_ax.bar(x, [100 * a.mean for a in afters], color="tab:blue", alpha=0.8, label="after")
    acc_ax.errorbar(x, [100 * a.mean for a in afters],
                    yerr=[[100 * (a.mean - a.low) for a in afters], [100 * (a.high - a.mean) for a in afters]],
                    fmt="none", ecolor="black", capsize=4)
    acc_ax.axhline(100 * before["accuracy"], color="tab:red", linestyle="--", label="before (starting policy)")
    for (name, control), style in zip(controls.items(), (":", "-."), strict=False):
        acc_ax.axhline(100 * control["accuracy"], color="gray", linestyle=style, label=name)
    acc_ax.set_xticks(x, names, rotation=20)
    acc_ax.set_ylabel("held-out first-answer accuracy (%)")
    acc_ax.set_title("held-out accuracy after training (95% interval over seeds)")
    acc_ax.grid(alpha=0.3, axis="y")
    acc_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
