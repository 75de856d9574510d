"""What the loss channels cost, as the trainer logs it (``time/<channel>_s``, ``memory/peak_gib``)
and ``training.png`` draws it: real TRL, a real model, a constructed batch (issue 42)."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from trainer_batches import make_batch, make_trainer

from trainer_client.config import ReplayConfig, SDPOConfig
from trainer_client.losses.costs import ChannelCosts, PeakMemory
from trainer_client.losses.pair_store import DpoPair, PairStore
from trainer_client.trainer import DebateGRPOTrainer

HINTS = {"solver/wrong_answer": "Your final answer is not correct. Re-derive it step by step."}


def stored_pair(trainer, tokenizer) -> DpoPair:
    context = tokenizer.apply_chat_template([{"role": "user", "content": "What is 6 times 7?"}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
    chosen_ids, rejected_ids = (tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                                for text in (r"It is \boxed{42}.", r"It is \boxed{41}."))
    pair = DpoPair(prompt_messages=[{"role": "user", "content": "What is 6 times 7?"}], chosen=r"It is \boxed{42}.",
                   rejected=r"It is \boxed{41}.", episode_id="e", t=0, role="solver", teacher="oracle", created_step=0,
                   context_ids=list(context), chosen_ids=chosen_ids, rejected_ids=rejected_ids)
    with torch.no_grad():
        ref_chosen, ref_rejected = trainer.trace_replay.pair_logps(trainer.model, [pair])
    pair.ref_chosen_logp, pair.ref_rejected_logp = ref_chosen.item() + 1.0, ref_rejected.item() - 1.0
    return pair


def test_each_channel_gets_its_forward_and_its_part_of_the_backward(model_and_tokenizer, tmp_path) -> None:
    model, tokenizer = model_and_tokenizer
    store = PairStore(tmp_path / "pairs.jsonl")
    trainer = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path, sdpo=SDPOConfig(alpha=0.1), hints=HINTS,
                           replay=ReplayConfig(beta=0.05, pairs_per_step=1, heldout_pair_share=0.0),
                           teacher_pool=object(), pair_store=store)
    store.add([stored_pair(trainer, tokenizer)])
    costs = trainer.costs
    assert costs in trainer.callback_handler.callbacks  # it logs at every step's end
    costs.on_step_begin(trainer.args, trainer.state, trainer.control)
    loss = trainer.compute_loss(model, make_batch(tokenizer, sites=[[(3, 9, "solver/wrong_answer")], []]))
    loss.backward()
    costs.on_step_end(trainer.args, trainer.state, trainer.control)
    # the autograd engine walks the last-built term first, GRPO's (built before both) last
    assert costs.backward_order() == ["replay", "sdpo", None]
    logged = trainer._metrics["train"]
    assert logged["time/sdpo_s"][0] > 0 and logged["time/replay_s"][0] > 0
    assert logged["memory/peak_gib"][0] > 0.05  # a torch process holds more than 50 MiB
    assert logged["replay/pairs"] == [1.0] and logged["sdpo/sites"] == [1.0]
    # a second step starts from zero: a step without the channels' work costs them 0 s
    costs.start_step()
    again = costs.end_step()
    assert set(again) == {"time/sdpo_s", "time/replay_s", "memory/peak_gib"}
    assert again["time/sdpo_s"] == again["time/replay_s"] == 0.0


def test_the_shares_add_up_to_no_more_than_the_step() -> None:
    """Three terms on one graph, as the trainer builds them: each channel gets its forward and
    the backward from its hook to the next one, so the channels' seconds never exceed the step's,
    and GRPO's own backward (the last, after both channels') is nobody's."""
    costs = ChannelCosts(torch.device("cpu"), ["first", "second"])
    weight = torch.randn(256, 256, requires_grad=True)
    x = torch.randn(256, 256)
    started = time.perf_counter()
    costs.start_step()
    shared = torch.tanh(x @ weight)
    total = costs.grpo_term(torch.stack([(shared @ weight).cos().mean() for _ in range(40)]).sum())
    total = total + costs.loss("first", lambda: ((shared @ weight).tanh().sum(), {}))[0]  # on shared activations
    total = total + costs.loss("second", lambda: (torch.stack([(x @ weight).sin().mean() for _ in range(20)]).sum(),
                                                  {}))[0]  # a graph of its own
    total.backward()
    metrics = costs.end_step()
    whole = time.perf_counter() - started
    assert costs.backward_order() == ["second", "first", None]
    assert metrics["time/first_s"] > 0 and metrics["time/second_s"] > 0
    assert metrics["time/first_s"] + metrics["time/second_s"] < whole


def test_peak_memory_follows_a_large_allocation() -> None:
    peak = PeakMemory(torch.device("cpu"))
    peak.reset()
    before = peak.gib()
    block = torch.ones(64, 2**20)  # 256 MiB, touched
    assert peak.gib() >= before + 0.2 or not peak.resettable
    del block
    if peak.resettable:  # a reset forgets the freed block
        peak.reset()
        assert peak.gib() < before + 0.2


def test_training_plot_has_a_cost_panel_when_costs_are_logged(tmp_path) -> None:
    from matplotlib.image import imread

    from trainer_client.training.reporting import plot_metrics

    base = [{"step": s, "debate/reward/solver": 0.5, "loss/grpo": 0.1, "loss/sdpo_jsd": 0.2} for s in range(1, 6)]
    plain, with_cost = tmp_path / "plain.jsonl", tmp_path / "cost.jsonl"
    plain.write_text("".join(json.dumps(line) + "\n" for line in base))
    with_cost.write_text("".join(json.dumps({**line, "time/sdpo_s": 0.1 * line["step"], "time/replay_s": 0.3,
                                             "memory/peak_gib": 2.0 + line["step"]}) + "\n" for line in base))
    widths = [imread(plot_metrics(path, tmp_path / f"{path.stem}.png")).shape[1] for path in (plain, with_cost)]
    assert widths[1] == pytest.approx(widths[0] * 3 / 2, rel=0.02)  # 3 panels instead of 2


def test_training_plot_has_a_hint_distillation_panel_when_its_teacher_is_measured(tmp_path) -> None:
    from matplotlib.image import imread

    from trainer_client.training.reporting import plot_metrics

    base = [{"step": s, "debate/reward/solver": 0.5, "loss/grpo": 0.1, "loss/sdpo_jsd": 0.2} for s in range(1, 6)]
    plain, measured = tmp_path / "plain.jsonl", tmp_path / "sdpo.jsonl"
    plain.write_text("".join(json.dumps(line) + "\n" for line in base))
    measured.write_text("".join(json.dumps({**line, "sdpo/teacher_advantage": -0.1 * line["step"]}) + "\n"
                                for line in base))
    widths = [imread(plot_metrics(path, tmp_path / f"{path.stem}.png")).shape[1] for path in (plain, measured)]
    assert widths[1] == pytest.approx(widths[0] * 3 / 2, rel=0.02)  # the teacher's advantage and the JSD: a 3rd panel
