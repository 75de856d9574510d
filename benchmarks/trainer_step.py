"""Trainer benchmark: the three-channel loss step against plain GRPO, and the JSD term's memory.

1. Step time: ``compute_loss`` + ``backward`` on the same batch, plain TRL ``GRPOTrainer`` vs
   ``DebateGRPOTrainer`` with all channels on (α = 0.1, β = 0.05) at a given error-site rate
   (share of rows with one erring turn) and DPO pairs in the store. Median of ``--repeats``
   interleaved runs after a warm-up; reported as ``ours / baseline`` (target <= 1.2 at 25%), at
   each DPO pair count asked for.
2. Peak memory of the hint-distillation JSD term: liger-kernel's fused linear JSD (hidden states,
   chunked, never the (N, V) logits) vs TRL's GKD JSD on full logits; each variant runs in a
   fresh process and reports its peak RSS above the process's baseline. Reported as
   ``naive / fused`` (higher is better). Skipped, with one line saying so, without liger-kernel.

Usage: ``python benchmarks/trainer_step.py [--repeats 7] [--error-site-rate 0.25] [--pairs-per-step 4 2 1]``
(the default list starts at ``ReplayConfig``'s default; the first count given is the JSON's ``ratio``; every count's ratio is
in ``ratio_by_pairs_per_step``, the largest within target in ``most_pairs_within_target``). CPU only here;
on a GPU box the same script times CUDA (memory part uses RSS, so run it on CPU).
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


#: the step-time target: the three-channel step costs at most this many plain GRPO steps (25 % error sites)
TARGET_RATIO = 1.2


def build_model(vocab: int, hidden: int, layers: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=8,
                         num_key_value_heads=4, intermediate_size=hidden * 3, max_position_embeddings=4096)
    return Qwen2ForCausalLM(config)


def make_trainers(model, tokenizer, workdir: Path, pairs_per_step: int = 4):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from trainer_client.config import ReplayConfig, SDPOConfig
    from trainer_client.losses.pair_store import PairStore
    from trainer_client.trainer import DebateGRPOTrainer
    from trainer_client.trl_compat import checkpointing_off

    def zero(completions, **kwargs):
        return [0.0] * len(completions)

    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "x"}]}] * 8)
    args = GRPOConfig(output_dir=str(workdir), use_cpu=True, bf16=False, per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=512, report_to=[], save_strategy="no", **checkpointing_off(GRPOConfig))
    plain = GRPOTrainer(model=model, reward_funcs=[zero], args=args, train_dataset=dataset, processing_class=tokenizer)
    store = PairStore(workdir / "pairs.jsonl")
    ours = DebateGRPOTrainer(model=model, reward_funcs=[zero], args=args, train_dataset=dataset, processing_class=tokenizer,
                             sdpo=SDPOConfig(alpha=0.1), replay=ReplayConfig(beta=0.05, pairs_per_step=pairs_per_step),
                             hints={"solver/wrong_answer": "Your final answer is not correct. Re-derive it."},
                             teacher_pool=object(), pair_store=store)
    for trainer in (plain, ours):
        trainer.current_gradient_accumulation_steps = 1
    return plain, ours, store


def make_batch(tokenizer, rows: int, prompt_len: int, completion_len: int, error_site_rate: float, vocab: int):
    import torch

    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(10, vocab, (rows, prompt_len), generator=generator)
    completion = torch.randint(10, vocab, (rows, completion_len), generator=generator)
    sites_rows = round(rows * error_site_rate)
    turn = completion_len // 3  # each debate has ~3 turns; an erring turn is one of them
    sites = [[(turn, 2 * turn, "solver/wrong_answer")] if i < sites_rows else [] for i in range(rows)]
    return {
        "prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt),
        "completion_ids": completion, "completion_mask": torch.ones_like(completion),
        "advantages": torch.randn(rows, completion_len, generator=generator),
        "num_items_in_batch": torch.tensor(rows * completion_len), "tool_mask": torch.ones_like(completion),
        "sdpo_sites": sites,
    }


def add_pairs(trainer, store, n: int, args) -> None:
    """``n`` stored pairs at their real size: the context is a debate's prompt plus the turns
    before the replayed one (``--prompt-len`` + 2/3 of ``--completion-len`` tokens, as the
    third turn of a rollout sees it), chosen and rejected one turn each (1/3 of the completion)."""
    import torch

    from trainer_client.losses.pair_store import DpoPair

    generator = torch.Generator().manual_seed(1)
    vocab = len(trainer.processing_class)
    turn = args.completion_len // 3
    context_len = args.prompt_len + 2 * turn

    def ids(length: int) -> list[int]:
        return torch.randint(10, vocab, (length,), generator=generator).tolist()

    pairs = [DpoPair(prompt_messages=[{"role": "user", "content": f"Problem {i}"}], chosen="teacher", rejected="student",
                     episode_id=f"e{i}", t=2, role="solver", teacher="oracle", created_step=0,
                     context_ids=ids(context_len), chosen_ids=ids(turn), rejected_ids=ids(turn)) for i in range(n)]
    with torch.no_grad():
        chosen, rejected = trainer.trace_replay.pair_logps(trainer.model, pairs)
    for pair, c, r in zip(pairs, chosen.tolist(), rejected.tolist(), strict=True):
        pair.ref_chosen_logp, pair.ref_rejected_logp = c, r
    store.add(pairs)


def time_step(trainer, model, batch) -> float:
    start = time.perf_counter()
    loss = trainer.compute_loss(model, dict(batch))
    loss.backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def step_time_benchmark(args) -> dict:
    """Median step times: plain GRPO, and ours at each ``args.pairs_per_step`` count, all
    interleaved in one loop so machine noise hits every variant alike."""
    import torch
    from transformers import AutoTokenizer

    from trainer_client.tiny_models.build import build_tiny_model

    torch.manual_seed(0)
    workdir = Path(tempfile.mkdtemp(prefix="mathdebate-bench-"))
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(args.tiny_model_dir))
    model = build_model(len(tokenizer), args.hidden, args.layers)
    model.train()
    plain, ours, store = make_trainers(model, tokenizer, workdir, args.pairs_per_step[0])
    add_pairs(ours, store, 16, args)
    batch = make_batch(tokenizer, args.rows, args.prompt_len, args.completion_len, args.error_site_rate, len(tokenizer))

    def ours_step(pairs: int) -> float:
        ours.trace_replay.config.pairs_per_step = pairs
        return time_step(ours, model, batch)

    for _ in range(2):  # warm-up
        time_step(plain, model, batch), [ours_step(pairs) for pairs in args.pairs_per_step]
    base: list[float] = []
    full: dict[int, list[float]] = {pairs: [] for pairs in args.pairs_per_step}
    for _ in range(args.repeats):  # interleaved, so machine noise hits every variant alike
        base.append(time_step(plain, model, batch))
        for pairs in args.pairs_per_step:
            full[pairs].append(ours_step(pairs))
    baseline = statistics.median(base)
    return {"baseline_s": baseline, "ours_s": {pairs: statistics.median(times) for pairs, times in full.items()},
            "ratio": {pairs: statistics.median(times) / baseline for pairs, times in full.items()}}


MEMORY_CHILD = r"""
import json, resource, sys, torch
variant, n, hidden, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
weight = torch.randn(vocab, hidden) * 0.02
student_h = torch.randn(n, hidden, requires_grad=True)
teacher_h = torch.randn(n, hidden)
labels = torch.randint(0, vocab, (n,))
if variant == "fused":
    from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss
    loss_fn = LigerFusedLinearJSDLoss(weight_hard_loss=0.0, weight_soft_loss=1.0, beta=0.5, compiled=False)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if variant == "fused":
    loss = loss_fn(student_h, weight, teacher_h, weight, labels)
else:
    from trainer_client.losses.functional import masked_jsd_loss
    student = (student_h @ weight.T).unsqueeze(0)
    with torch.no_grad():
        teacher = (teacher_h @ weight.T).unsqueeze(0)
    loss = masked_jsd_loss(student, teacher, torch.ones(1, n, dtype=torch.bool))
loss.backward()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"peak_mb": (peak - base) / 1024, "loss": loss.item()}))
"""


def jsd_memory(variant: str, tokens: int, hidden: int, vocab: int) -> dict:
    done = subprocess.run([sys.executable, "-c", MEMORY_CHILD, variant, str(tokens), str(hidden), str(vocab)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--error-site-rate", type=float, default=0.25)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--pairs-per-step", type=int, nargs="+", default=[4, 2, 1],
                        help="DPO pairs in the replay term of one optimiser step (ReplayConfig.pairs_per_step); "
                             "several counts are timed interleaved, the first is the JSON's 'ratio'")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--completion-len", type=int, default=384)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--jsd-tokens", type=int, default=2048)
    parser.add_argument("--jsd-vocab", type=int, default=32768)
    parser.add_argument("--tiny-model-dir", default="outputs/tiny-model")
    args = parser.parse_args()

    step = step_time_benchmark(args)
    have_liger = importlib.util.find_spec("liger_kernel") is not None
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"machine: {os.cpu_count()} CPUs, torch CPU; peak RSS {peak_rss_mb:.0f} MB")
    print(f"{'measure':58} {'baseline':>12} {'ours':>12} {'ratio':>8}")
    for pairs in args.pairs_per_step:
        print(f"{f'loss step, median s, {pairs} DPO pair(s) per step':58} {step['baseline_s']:12.4f} "
              f"{step['ours_s'][pairs]:12.4f} {step['ratio'][pairs]:8.2f}   (plain GRPO vs 3 channels, "
              f"{args.error_site_rate:.0%} error sites; lower is better)")
    within = [pairs for pairs in args.pairs_per_step if step["ratio"][pairs] <= TARGET_RATIO]
    first = args.pairs_per_step[0]
    result = {
        "benchmark": "trainer_step",
        "ours": round(step["ours_s"][first], 5), "baseline": round(step["baseline_s"], 5),
        "ratio": round(step["ratio"][first], 3), "target_ratio_max": TARGET_RATIO, "error_site_rate": args.error_site_rate,
        "runs": args.repeats, "rows": args.rows, "pairs_per_step": first,
        "ratio_by_pairs_per_step": {str(pairs): round(ratio, 3) for pairs, ratio in step["ratio"].items()},
        "most_pairs_within_target": max(within) if within else 0,
    }
    from env_server.provenance import provenance

    result["provenance"] = provenance(vars(args))
    if have_liger:
        fused = jsd_memory("fused", args.jsd_tokens, args.hidden, args.jsd_vocab)
        naive = jsd_memory("naive", args.jsd_tokens, args.hidden, args.jsd_vocab)
        print(f"{'JSD term peak memory, MB (naive full logits vs fused)':58} {naive['peak_mb']:12.1f} "
              f"{fused['peak_mb']:12.1f} {naive['peak_mb'] / max(fused['peak_mb'], 1e-9):8.1f}   "
              f"({args.jsd_tokens} tokens x vocab {args.jsd_vocab}; higher is better)")
        result.update({"jsd_peak_mb_fused": round(fused["peak_mb"], 1), "jsd_peak_mb_naive": round(naive["peak_mb"], 1),
                       "jsd_memory_ratio": round(naive["peak_mb"] / max(fused["peak_mb"], 1e-9), 2)})
    else:
        print("JSD memory part skipped: liger-kernel is not installed (pip install 'mathdebate[liger]' to measure it)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
