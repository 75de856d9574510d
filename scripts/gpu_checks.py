"""The GPU checks behind ``scripts/check_gpu.sh``: one line per check, on the offline tiny model,
with no downloads.

- ``bf16-train``: ``mathdebate train``'s path (``run_training``) for 2 steps on CUDA, where
  ``GRPOConfig`` picks bf16; the loss is finite and the model's parameters are on the GPU;
- ``liger-jsd``: liger-kernel's fused linear JSD (the SDPO ``liger`` backend) against the GKD JSD
  on full logits (the ``gkd`` backend), same inputs on CUDA: same value within 1e-3 (relative),
  lower peak CUDA memory;
- ``liger-train``: 3 steps of the demo's configuration (all three channels) with
  ``sdpo.backend: liger``: the fused JSD inside training, ``loss/sdpo_jsd`` logged and finite;
- ``hf-eval``: ``mathdebate eval --policy hf:<tiny>`` on CUDA (``load_hf_model`` moves the model
  there), 5 problems, no failed request;
- ``vllm-colocate``: 2 steps with ``use_vllm: true, vllm_mode: colocate`` where vLLM is installed;
  the rollouts came from vLLM (TRL's ``sampling/sampling_logp_difference/mean`` is logged);
- ``scale``: ``benchmarks/trainer_overhead.py --shape qwen3-0.6b`` (the Qwen3-0.6B shape with its
  151,936-token vocabulary, random weights, 6 steps per arm, one run of each arm): plain TRL,
  GRPO-only and both channels in fresh processes; the line gives each arm's s/step, time outside
  generation and peak CUDA memory and the two ratios (targets: GRPO-only within 1.05x of plain
  TRL in step time and memory; both channels within 1.25x of GRPO-only in step time and 1.15x in
  memory). About 5 minutes on an H100; ``--skip-scale`` leaves it out.

A check that cannot run prints ``unavailable: <why>``; a check that ran and failed prints
``FAIL``, and the script then exits 1. Usage: ``python scripts/gpu_checks.py [--work DIR]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
REPO = Path(__file__).resolve().parents[1]


def _no_cuda() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed (scripts/setup_env.sh train)"
    if not torch.cuda.is_available():
        return f"no CUDA device (torch {torch.__version__}, torch.cuda.is_available() is False)"
    return None


def _train(work: Path, tiny: Path, url: str, name: str, steps: int, **overrides) -> list[dict]:
    from trainer_client.cli import demo_config
    from trainer_client.credit.shaping import RewardShapingConfig
    from trainer_client.training.reporting import read_metrics
    from trainer_client.training.train import run_training

    out = work / name
    config = demo_config(str(out), url, steps).model_copy(update={
        "model": str(tiny), "problems": None, "per_device_train_batch_size": 4, "num_generations": 4,
        "max_completion_length": 256, "learning_rate": 5e-4,
        "reward_shaping": RewardShapingConfig(strategy="reward_mixing", params={"alpha": 0.5}), **overrides})
    run_training(config, progress=False)
    return read_metrics(out / "metrics.jsonl")


def check_bf16_train(work: Path, tiny: Path, url: str) -> str:
    import torch

    if not torch.cuda.is_bf16_supported():
        return f"unavailable: {torch.cuda.get_device_name()} has no bf16"
    lines = _train(work, tiny, url, "bf16", 2)
    losses = [line["loss"] for line in lines]
    assert len(lines) == 2 and all(abs(x) < 1e6 for x in losses), losses
    config = json.loads((work / "bf16" / "final" / "config.json").read_text())
    return f"ok: 2 steps on {torch.cuda.get_device_name()}, losses {losses}, saved dtype {config.get('dtype')}"


def check_liger_jsd(work: Path, tiny: Path, url: str) -> str:
    if importlib.util.find_spec("liger_kernel") is None:
        return "unavailable: liger-kernel is not installed (pip install 'mathdebate[liger]')"
    import torch
    from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss

    from trainer_client.losses.functional import masked_jsd_loss

    n, hidden, vocab = 4096, 512, 32768
    torch.manual_seed(0)
    weight = (torch.randn(vocab, hidden) * 0.02).cuda()
    student = torch.randn(n, hidden, device="cuda")
    teacher = torch.randn(n, hidden, device="cuda")
    labels = torch.randint(0, vocab, (n,), device="cuda")

    def run(fused: bool) -> tuple[float, float]:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        h = student.clone().requires_grad_(True)
        if fused:
            loss = LigerFusedLinearJSDLoss(weight_hard_loss=0.0, weight_soft_loss=1.0, beta=0.5,
                                           compiled=False)(h, weight, teacher, weight, labels)
        else:
            with torch.no_grad():
                teacher_logits = (teacher @ weight.T).unsqueeze(0)
            loss = masked_jsd_loss((h @ weight.T).unsqueeze(0), teacher_logits, torch.ones(1, n, dtype=torch.bool,
                                                                                             device="cuda"))
        loss.backward()
        torch.cuda.synchronize()
        return loss.item(), (torch.cuda.max_memory_allocated() - base) / 2**20

    fused, fused_mb = run(True)
    gkd, gkd_mb = run(False)
    assert abs(fused - gkd) <= 1e-3 * max(abs(gkd), 1e-6), (fused, gkd)
    assert fused_mb < gkd_mb, (fused_mb, gkd_mb)
    return f"ok: fused {fused:.6f} vs gkd {gkd:.6f}; peak {fused_mb:.0f} MiB vs {gkd_mb:.0f} MiB ({n} tokens, V={vocab})"


def check_liger_train(work: Path, tiny: Path, url: str) -> str:
    if importlib.util.find_spec("liger_kernel") is None:
        return "unavailable: liger-kernel is not installed (pip install 'mathdebate[liger]')"
    from trainer_client.cli import demo_config

    sdpo = demo_config(str(work / "liger-train"), url, 3).sdpo.model_copy(update={"alpha": 0.1, "backend": "liger"})
    lines = _train(work, tiny, url, "liger-train", 3, sdpo=sdpo)
    jsd = [line.get("loss/sdpo_jsd") for line in lines]  # None on a step without error sites
    logged = [j for j in jsd if j is not None]
    assert len(lines) == 3 and logged and all(0 <= j < 1e3 for j in logged), jsd
    return f"ok: 3 steps, loss/sdpo_jsd per step {[None if j is None else round(j, 4) for j in jsd]}"


def check_hf_eval(work: Path, tiny: Path, url: str) -> str:
    out = work / "hf-eval"
    done = subprocess.run([sys.executable, "-m", "trainer_client.cli", "eval", "--policy", f"hf:{tiny}", "--problems",
                           "gen:single_digit_sum", "--limit", "5", "--no-progress", "--output-dir", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert results["requests_failed"] == 0, results["requests_failed"]
    return (f"ok: 5 problems, first-answer accuracy {results['first_answer_accuracy']:.2f}, "
            f"{results['seconds']:.1f} s")


def check_vllm_colocate(work: Path, tiny: Path, url: str) -> str:
    if importlib.util.find_spec("vllm") is None:
        return "unavailable: vLLM is not installed (pip install 'mathdebate[train,vllm]')"
    lines = _train(work, tiny, url, "vllm", 2, use_vllm=True, vllm_mode="colocate",
                   vllm_gpu_memory_utilization=0.3)
    gaps = [line.get("sampling/sampling_logp_difference/mean") for line in lines]
    assert all(gap is not None and gap < 0.1 for gap in gaps), gaps
    return f"ok: 2 steps, vLLM-vs-trainer log-prob gap per step {gaps}"


def check_scale(work: Path, tiny: Path, url: str) -> str:
    # its own env server and fresh processes per arm: the benchmark's figures need both
    done = subprocess.run([sys.executable, "benchmarks/trainer_overhead.py", "--shape", "qwen3-0.6b", "--repeats", "1",
                           "--tiny-model-dir", str(tiny), "--work", str(work / "scale")],
                          capture_output=True, text=True, timeout=1500, cwd=REPO)
    assert done.returncode == 0, (done.stdout[-1500:], done.stderr[-1500:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    arms = ", ".join(f"{arm} {f['s_per_step']:.2f} s/step, {f['outside_generation_s']:.2f} s outside generation, "
                     f"{f['peak_memory_gib']:.1f} GiB" for arm, f in result["arms"].items())
    return (f"ok: qwen3-0.6b on {result['device']}: {arms}; grpo_vs_trl {json.dumps(result['grpo_vs_trl'])}; "
            f"full_vs_grpo {json.dumps(result['full_vs_grpo'])}")


CHECKS = {"bf16-train": check_bf16_train, "liger-jsd": check_liger_jsd, "liger-train": check_liger_train,
          "hf-eval": check_hf_eval, "vllm-colocate": check_vllm_colocate, "scale": check_scale}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default=None, help="working directory (default: a temporary one)")
    parser.add_argument("--skip-scale", action="store_true", help="leave out the scale benchmark (about 5 minutes)")
    args = parser.parse_args()
    why = _no_cuda()
    if why is not None:
        for name in CHECKS:
            print(f"{name}: unavailable: {why}", flush=True)
        return 0
    from env_server.cli import running_server
    from trainer_client.tiny_models.build import build_tiny_model

    work = Path(args.work or tempfile.mkdtemp(prefix="mathdebate-gpu-"))
    tiny = build_tiny_model(work / "tiny-model")
    failed = 0
    with running_server(["--grading-workers", "2"]) as url:
        for name, check in CHECKS.items():
            if name == "scale" and args.skip_scale:
                print("scale: skipped (--skip-scale)", flush=True)
                continue
            try:
                line = check(work, tiny, url)
            except Exception as exc:  # one failed check must not hide the others
                failed += 1
                detail = traceback.format_exc(limit=3).strip().splitlines()[-1]
                line = f"FAIL: {type(exc).__name__}: {exc} ({detail})"[:800]
            print(f"{name}: {line}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
