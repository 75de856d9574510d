"""Whole training steps against one env server: plain TRL, ours GRPO-only, ours with both loss channels.

Three arms, each in a fresh process (a peak measured after another arm means nothing), the same
model, data, seeds and TRL arguments (checked: the arms' ``GRPOConfig`` must match), against one
``mathdebate serve``:

- ``trl``: plain ``trl.GRPOTrainer`` with ``environment_factory`` exactly as TRL documents it
  (:class:`~trainer_client.rollout.environment.DebateEnvironment`, the environment's reward only);
- ``grpo``: ``run_training`` with preset ``baseline`` (GRPO only);
- ``full``: ``run_training`` with preset ``full`` (GRPO + hint distillation α 0.1 + trace-replay
  DPO β 0.05, 4 pairs per step, two oracle teachers), the preset's defaults untouched; every
  measured step must have run hint-distillation sites and DPO pairs, or the benchmark fails.

Every completion is forced to ``--completion-len`` tokens (``generation_kwargs``:
``min_new_tokens`` = ``max_new_tokens``, the chat template's special tokens suppressed), so the
arms generate the same number of tokens: a random-weight model writes plain text, each rollout
is one solver turn the adapter submits as the solver's answer (``missing_final_answer``: an
error site over the whole turn, and a wrong answer the oracle teachers correct).

Per arm: seconds per step and the time outside generation (``GRPOTrainer._generate``, the tool
loop included, is generation), peak memory (CUDA: ``torch.cuda.max_memory_allocated``; CPU: the
process's peak RSS, ``VmHWM``, reset at each step through ``/proc/self/clear_refs``; the highest
of the measured steps),
completion tokens per second; the first step is excluded from all of them (warm-up; at 0.44B the
peak was still rising at step 3, so at least 6 steps per arm). The arms' order rotates across
``--repeats``; each figure is the median over an arm's measured steps, then over repeats.

Shapes (random weights; the offline tiny model's tokenizer and chat template, its vocabulary
padded with plain-text tokens to the shape's size where larger):

- ``tiny``: the suite's smoke test (hidden 64, 2 layers, the tiny vocabulary, short completions);
- ``vocab``: CPU, hidden 256, 4 layers, Qwen3's vocabulary size 151,936, where full-vocabulary
  logits decide the cost;
- ``qwen3-0.6b``: GPU, the Qwen3-0.6B shape (hidden 1024, 28 layers, 16 heads, 8 KV heads,
  intermediate 3072, vocabulary 151,936, tied embeddings; bf16 weights as on the Hub).

``--tree DIR`` runs the arms on another checkout's ``trainer_client`` (an A/B against the commit
before a change: ``git worktree add /tmp/old <commit>``); this script stays the measuring one.

``--full-override KEY=VALUE`` (repeatable) sets the ``full`` arm's settings as ``train -o`` does, so
the channels are measured at the settings an ablation chose (issue 56's item 5: R1's and S1's).

Usage: ``python benchmarks/trainer_overhead.py --shape vocab [--steps 6] [--repeats 2]``. The last
line printed is one JSON object with ``grpo_vs_trl`` and ``full_vs_grpo``, each
``{"s_per_step", "outside_generation_s", "peak_memory"}`` (ratios of the medians).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
REPO = Path(__file__).resolve().parents[1]

#: Model shapes: Qwen3 configurations (random weights). ``vocab`` None: the tiny tokenizer's size.
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 16, "intermediate_size": 128, "vocab": None, "completion_len": 24, "prompts": 1,
             "generations": 2, "steps": 2, "dtype": "float32"},
    "vocab": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 64, "intermediate_size": 768, "vocab": 151_936, "completion_len": 256, "prompts": 2,
              "generations": 4, "steps": 6, "dtype": "float32"},
    "qwen3-0.6b": {"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
                   "head_dim": 128, "intermediate_size": 3072, "vocab": 151_936, "completion_len": 256, "prompts": 2,
                   "generations": 4, "steps": 6, "dtype": "bfloat16"},
}
ARMS = ("trl", "grpo", "full")
ARM_NAMES = {"trl": "plain TRL GRPOTrainer + environment_factory", "grpo": "run_training, preset baseline (GRPO)",
             "full": "run_training, preset full (GRPO + SDPO + replay)"}
#: ``GRPOConfig`` fields that name where an arm writes, not how it trains
_PATH_FIELDS = {"output_dir", "logging_dir", "run_name", "hub_model_id"}


# ---------------------------------------------------------------------------------------- the model


def padded_tokenizer(tiny_dir: Path, out_dir: Path, vocab_size: int | None) -> int:
    """Write the tiny model's tokenizer and chat template into ``out_dir``, its BPE vocabulary
    padded with plain-text tokens (``" w<k>"``, never produced by encoding, decoded as text) up to
    ``vocab_size`` (``None``: as it is). Returns the tokenizer's length."""
    from transformers import AutoTokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    tokenizer.save_pretrained(out_dir)
    if vocab_size is None or vocab_size <= len(tokenizer):
        return len(tokenizer)
    data = json.loads((out_dir / "tokenizer.json").read_text())
    vocab: dict[str, int] = data["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(len(vocab))), "the tiny BPE vocabulary has contiguous ids"
    k = 0
    while len(vocab) < vocab_size:
        token = f"\u0120w{k}"  # byte-level "Ġ": decodes as a space
        if token not in vocab:
            vocab[token] = len(vocab)
        k += 1
    (out_dir / "tokenizer.json").write_text(json.dumps(data))
    size = len(AutoTokenizer.from_pretrained(out_dir))
    assert size == vocab_size, (size, vocab_size)
    return size


def build_model(shape: str, tiny_dir: Path, out_dir: Path, seed: int) -> Path:
    """A random-weight Qwen3 model of ``shape`` with the padded tiny tokenizer, saved in
    ``out_dir`` (reused when already there)."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    spec = SHAPES[shape]
    marker = out_dir / "shape.json"
    wanted = {"shape": shape, "seed": seed, **spec}
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        return out_dir
    vocab = padded_tokenizer(tiny_dir, out_dir, spec["vocab"])
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    config = Qwen3Config(vocab_size=vocab, hidden_size=spec["hidden_size"], num_hidden_layers=spec["num_hidden_layers"],
                         num_attention_heads=spec["num_attention_heads"], num_key_value_heads=spec["num_key_value_heads"],
                         head_dim=spec["head_dim"], intermediate_size=spec["intermediate_size"],
                         max_position_embeddings=40_960, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(getattr(torch, spec["dtype"]))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir)
    marker.write_text(json.dumps(wanted))
    return out_dir


# ---------------------------------------------------------------------------------------- one arm


class _Peak:
    """The process's peak memory since :meth:`reset`: CUDA's allocator peak, else the peak RSS
    (``VmHWM``, which writing ``5`` to ``/proc/self/clear_refs`` resets on Linux; where it cannot,
    ``ru_maxrss``, a peak since the process started, and :attr:`method` says so)."""

    def __init__(self) -> None:
        import torch

        self.cuda = torch.cuda.is_available()
        self.method = "torch.cuda.max_memory_allocated" if self.cuda else "VmHWM after clear_refs"

    def reset(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            self.method = "ru_maxrss (whole process: clear_refs not writable)"

    def gib(self) -> float:
        import resource

        import torch

        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() / 2**30
        if self.method.startswith("VmHWM"):
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**20
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


_GENERATION_S: list[float] = []


def _time_generation() -> None:
    """Time every ``GRPOTrainer._generate`` (generation and TRL's tool loop) of this process."""
    import torch
    from trl import GRPOTrainer

    original = GRPOTrainer._generate

    def timed(self: Any, prompts: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(self, prompts)
        finally:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            _GENERATION_S.append(time.perf_counter() - start)

    GRPOTrainer._generate = timed  # type: ignore[method-assign]  # the benchmark's clock around trl 1.16's _generate


def _step_clock():
    """A ``TrainerCallback`` recording each step's seconds, generation seconds and logs."""
    import torch
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.steps: list[dict[str, Any]] = []
            self.logs: dict[int, dict[str, float]] = {}
            self.args: dict[str, Any] = {}
            self.peak = _Peak()
            self.peak_gib: float | None = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.args = {k: v for k, v in args.to_dict().items() if k not in _PATH_FIELDS}

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.peak.reset()  # each step's own peak (the trainer's memory/peak_gib resets it there too)
            _GENERATION_S.clear()
            self.start = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.steps.append({"step_s": time.perf_counter() - self.start, "generation_s": sum(_GENERATION_S),
                               "peak_gib": self.peak.gib(), "loadavg_1m": os.getloadavg()[0]})
            if len(self.steps) > 1:  # the first step is excluded from the peak
                self.peak_gib = max(s["peak_gib"] for s in self.steps[1:])

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
            numbers = {k: float(v) for k, v in (logs or {}).items() if isinstance(v, (int, float))}
            self.logs.setdefault(state.global_step, {}).update(numbers)

    return StepClock()


def train_config(arm: str, spec: dict[str, Any], out: Path):
    """The arm's ``TrainConfig`` (``trl`` takes its TRL arguments from the ``grpo`` one)."""
    from trainer_client.config import TrainConfig, load_config

    forced: dict[str, Any] = {"min_new_tokens": spec["completion_len"], "suppress_tokens": spec["suppress_tokens"]}
    overrides: dict[str, Any] = {
        "model": spec["model_dir"], "env_url": spec["url"], "problems": None, "output_dir": str(out),
        "max_steps": spec["steps"], "per_device_train_batch_size": spec["prompts"] * spec["generations"],
        "num_generations": spec["generations"], "max_completion_length": spec["completion_len"],
        "learning_rate": 5e-4, "max_rounds": 1, "logging_steps": 1, "dataset_size": 64, "seed": spec["seed"],
        "replay.teachers": [{"name": "oracle-a", "kind": "oracle"}, {"name": "oracle-b", "kind": "oracle"}]}
    if "generation_kwargs" in TrainConfig.model_fields:
        overrides["generation_kwargs"] = forced
    if arm == "full":
        overrides.update(spec.get("full_overrides", {}))
    return load_config(None, "full" if arm == "full" else "baseline", overrides), forced


def _force_generation_kwargs(forced: dict[str, Any]) -> None:
    """For a tree whose ``TrainConfig`` has no ``generation_kwargs`` (an A/B against an older
    commit): every ``GRPOConfig`` built in this process gets ``forced``."""
    from trl.trainer.grpo_config import GRPOConfig

    original = GRPOConfig.__post_init__

    def post_init(self: Any) -> None:
        self.generation_kwargs = {**(self.generation_kwargs or {}), **forced}
        original(self)

    GRPOConfig.__post_init__ = post_init  # type: ignore[method-assign]  # records every arm's GRPOConfig to compare


@contextmanager
def _profiled(spec: dict[str, Any], stem: Path) -> Iterator[list[Any]]:
    """With ``spec["profile"]``: ``torch.profiler`` over the arm's steps after the first (CPU
    activities, and CUDA's where present; memory recorded), written as ``<stem>.txt`` (the
    operators by self time, and by self memory) and ``<stem>.json`` (every operator's and
    ``channel/<key>`` range's totals). Yields the ``TrainerCallback`` list that steps it."""
    if not spec.get("profile"):
        yield []
        return
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule
    from transformers import TrainerCallback

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    profiler = profile(activities=activities, schedule=schedule(wait=1, warmup=0, active=spec["steps"] - 1, repeat=1),
                       profile_memory=True, record_shapes=False)

    class Step(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            profiler.step()

    with profiler:
        yield [Step()]
    averages = profiler.key_averages()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    stem.with_suffix(".txt").write_text(
        averages.table(sort_by=f"self_{device}_time_total", row_limit=45) + "\n"
        + averages.table(sort_by=f"self_{device}_memory_usage", row_limit=25) + "\n")
    rows = [{"name": e.key, "count": e.count, "cpu_total_s": e.cpu_time_total / 1e6, "self_cpu_s": e.self_cpu_time_total / 1e6,
             "device_total_s": getattr(e, "device_time_total", 0.0) / 1e6,
             "self_memory_gib": getattr(e, f"self_{device}_memory_usage", 0) / 2**30} for e in averages]
    stem.with_suffix(".json").write_text(json.dumps({"steps": spec["steps"] - 1, "events": rows}))


def plain_trl(config: Any, clock: Any, callbacks: list[Any] | None = None) -> None:
    """Plain TRL: ``GRPOTrainer`` + ``environment_factory`` as TRL documents it, on the same model,
    data, seed and ``GRPOConfig`` as ``run_training`` builds from ``config`` (the parent checks the
    arguments match)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from trainer_client.rollout.environment import environment_factory
    from trainer_client.rollout.tools import DEBATE_SYSTEM_PROMPT
    from trainer_client.trl_compat import checkpointing_off

    cuda = torch.cuda.is_available()
    args = GRPOConfig(  # as trainer_client/training/train.py builds it
        output_dir=config.output_dir, max_steps=config.max_steps, learning_rate=config.learning_rate,
        per_device_train_batch_size=config.per_device_train_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps, num_generations=config.num_generations,
        max_completion_length=config.max_completion_length,
        max_tool_calling_iterations=config.max_tool_calling_iterations, temperature=config.temperature,
        **({"generation_kwargs": config.generation_kwargs} if hasattr(config, "generation_kwargs") else {}),
        loss_type=config.loss_type, beta=config.kl_beta, seed=config.seed, logging_steps=config.logging_steps,
        save_strategy="no", save_steps=500, report_to=config.report_to, use_cpu=not cuda,
        bf16=cuda and torch.cuda.is_bf16_supported(), **checkpointing_off(GRPOConfig), use_vllm=config.use_vllm,
        vllm_mode=config.vllm_mode, vllm_gpu_memory_utilization=config.vllm_gpu_memory_utilization,
        disable_tqdm=True)
    torch.manual_seed(config.seed)
    model = AutoModelForCausalLM.from_pretrained(config.model)
    tokenizer = AutoTokenizer.from_pretrained(config.model)
    dataset = Dataset.from_list([
        {"prompt": [{"role": "system", "content": DEBATE_SYSTEM_PROMPT}, {"role": "user", "content": ""}],
         "seed": config.seed + i} for i in range(config.dataset_size)])
    trainer = GRPOTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                          environment_factory=environment_factory(config.env_url, None, config.max_rounds,
                                                                  config.rewards_timeout_s, config.mode),
                          callbacks=[clock, *(callbacks or [])])
    trainer.train()


def run_arm(arm: str, spec: dict[str, Any], out: Path) -> dict[str, Any]:
    """Train ``spec["steps"]`` steps of ``arm`` in this process; its figures and logs."""
    import torch

    from trainer_client.config import TrainConfig

    shutil.rmtree(out, ignore_errors=True)  # a fresh run: no pair store or checkpoint of an earlier one
    config, forced = train_config(arm, spec, out)
    if "generation_kwargs" not in TrainConfig.model_fields:
        _force_generation_kwargs(forced)
    _time_generation()
    clock = _step_clock()
    with _profiled(spec, out.parent / f"profile-{arm}-{spec['run']}") as callbacks:
        if arm == "trl":
            plain_trl(config, clock, callbacks)
        else:
            from trainer_client.training.train import run_training

            run_training(config, progress=False, callbacks=[clock, *callbacks])
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    return {"arm": arm, "steps": clock.steps, "logs": {str(k): v for k, v in sorted(clock.logs.items())},
            "peak_memory_gib": clock.peak_gib, "memory_method": clock.peak.method, "args": clock.args,
            "device": device, "torch_threads": torch.get_num_threads()}


# ---------------------------------------------------------------------------------------- the parent


def check_arm(result: dict[str, Any], spec: dict[str, Any]) -> None:
    """Every measured step generated exactly the forced length; the ``full`` arm's ran both
    channels (hint-distillation sites and DPO pairs).

    Raises:
        AssertionError: the arm did not do what is measured.
    """
    steps = len(result["steps"])
    assert steps == spec["steps"], f"{result['arm']}: {steps} steps of {spec['steps']}"
    for step in range(2, steps + 1):
        logs = result["logs"].get(str(step), {})
        lengths = (logs.get("completions/min_length"), logs.get("completions/max_length"))
        assert lengths == (spec["completion_len"],) * 2, f"{result['arm']} step {step}: completion lengths {lengths}"
        if result["arm"] == "full":
            sites = logs.get("sdpo/sites", 0.0)
            pairs = logs.get("replay/pairs", 1.0 if logs.get("loss/trace_replay_dpo", 0.0) > 0 else 0.0)
            assert sites > 0 and pairs > 0, f"full step {step}: {sites} hint-distillation sites, {pairs} DPO pairs"


def summarise(result: dict[str, Any], spec: dict[str, Any]) -> dict[str, float]:
    """Medians over the measured steps (the first excluded)."""
    measured = result["steps"][1:]
    tokens = spec["prompts"] * spec["generations"] * spec["completion_len"]
    step_s = statistics.median(s["step_s"] for s in measured)
    figures = {"s_per_step": step_s,
               "outside_generation_s": statistics.median(s["step_s"] - s["generation_s"] for s in measured),
               "generation_s": statistics.median(s["generation_s"] for s in measured),
               "peak_memory_gib": result["peak_memory_gib"], "completion_tokens_per_s": tokens / step_s}
    for key in ("time/sdpo_s", "time/replay_s", "memory/peak_gib"):
        values = [result["logs"][str(step)][key] for step in range(2, len(result["steps"]) + 1)
                  if key in result["logs"].get(str(step), {})]
        if values:
            figures[key] = statistics.median(values)
    return figures


def child_command(arm: str, spec_path: Path, out_path: Path, tree: Path) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--child", arm, "--spec", str(spec_path),
            "--result", str(out_path), "--tree", str(tree)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="vocab")
    parser.add_argument("--steps", type=int, default=None, help="steps per arm, the first excluded (default: the shape's)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of every arm, the order rotated")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--completion-len", type=int, default=None, help="forced completion tokens (default: the shape's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--full-override", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of the full arm only, as `train -o` takes it (repeatable): measure the "
                             "channels at the settings an ablation chose rather than the preset's")
    parser.add_argument("--tiny-model-dir", default="outputs/tiny-model",
                        help="the offline tiny model (its tokenizer and chat template; built there when missing)")
    parser.add_argument("--work", default=None, help="working directory (default: a temporary one)")
    parser.add_argument("--tree", default=str(REPO), help="the checkout whose trainer_client the arms run")
    parser.add_argument("--concurrent", action="store_true",
                        help="start a run's arms together (a smoke test: the timings are then not comparable)")
    parser.add_argument("--profile", action="store_true",
                        help="torch.profiler over each arm's measured steps: profile-<arm>-<run>.txt/.json in --work "
                             "(timings then include the profiler's overhead)")
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:  # one arm in this fresh process, on --tree's code
        sys.path.insert(0, str(Path(args.tree).resolve()))
        spec = json.loads(Path(args.spec).read_text())
        result = run_arm(args.child, spec, Path(spec["work"]) / f"{args.child}-{spec['run']}")
        Path(args.result).write_text(json.dumps(result))
        return 0

    sys.path.insert(0, str(REPO))
    from env_server.cli import running_server
    from env_server.provenance import provenance
    from trainer_client.config import parse_overrides
    from trainer_client.tiny_models.build import SPECIAL_TOKENS, build_tiny_model

    shape = SHAPES[args.shape]
    steps = args.steps or shape["steps"]
    if steps < 2:
        parser.error("--steps must be at least 2 (the first step is excluded)")
    work = Path(args.work or tempfile.mkdtemp(prefix="mathdebate-overhead-"))
    tiny = build_tiny_model(args.tiny_model_dir)
    model_dir = build_model(args.shape, tiny, work / f"model-{args.shape}", args.seed)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    eos = tokenizer.eos_token_id
    suppress = [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS if tokenizer.convert_tokens_to_ids(t) != eos]
    spec = {"model_dir": str(model_dir), "steps": steps, "seed": args.seed, "work": str(work),
            "completion_len": args.completion_len or shape["completion_len"], "prompts": shape["prompts"],
            "generations": shape["generations"], "suppress_tokens": suppress, "profile": args.profile,
            "full_overrides": parse_overrides(args.full_override)}
    tree = Path(args.tree).resolve()
    results: dict[str, list[dict[str, Any]]] = {arm: [] for arm in args.arms}
    loads: list[tuple[str, float, float]] = []
    with running_server(["--grading-workers", "2"], cwd=str(tree)) as url:
        spec["url"] = url
        record = provenance({**vars(args), **{k: v for k, v in spec.items() if k != "suppress_tokens"}}, [url],
                            root=tree)
        for run in range(args.repeats):
            order = args.arms[run % len(args.arms):] + args.arms[:run % len(args.arms)]
            # one arm at a time; --concurrent (the smoke test) starts them together
            batches = [order] if args.concurrent else [[arm] for arm in order]
            for batch in batches:
                before, started = os.getloadavg()[0], time.perf_counter()
                children = {}
                for arm in batch:
                    spec_path = work / f"spec-{arm}-{run}.json"
                    spec_path.write_text(json.dumps({**spec, "run": run}))
                    children[arm] = subprocess.Popen(child_command(arm, spec_path, work / f"result-{arm}-{run}.json",
                                                                   tree), cwd=tree, stdout=subprocess.DEVNULL,
                                                     stderr=subprocess.PIPE, text=True)
                errors = {arm: child.communicate()[1] for arm, child in children.items()}
                for arm, child in children.items():
                    if child.returncode != 0:
                        sys.stderr.write(errors[arm][-6000:])
                        raise SystemExit(f"arm {arm} (run {run}) failed with exit code {child.returncode}")
                for arm in batch:
                    result = json.loads((work / f"result-{arm}-{run}.json").read_text())
                    check_arm(result, spec)
                    results[arm].append(result)
                    loads.append((arm, before, os.getloadavg()[0]))
                    print(f"run {run} {arm:5} {statistics.median(s['step_s'] for s in result['steps'][1:]):8.2f} "
                          f"s/step  peak {result['peak_memory_gib']:.2f} GiB  loadavg {before:.2f} -> "
                          f"{loads[-1][2]:.2f}  (process {time.perf_counter() - started:.0f} s)", flush=True)

    reference = next(iter(results.values()))[0]["args"]
    for arm, runs in results.items():  # same TRL arguments in every arm
        for result in runs:
            differ = {k for k in set(reference) | set(result["args"]) if reference.get(k) != result["args"].get(k)}
            assert not differ, f"arm {arm}: GRPOConfig differs from the first arm's in {sorted(differ)}"
    per_run = {arm: [summarise(r, spec) for r in runs] for arm, runs in results.items()}
    figures = {arm: {key: statistics.median(run[key] for run in runs) for key in runs[0]}
               for arm, runs in per_run.items()}
    device = next(iter(results.values()))[0]["device"]
    memory_method = next(iter(results.values()))[0]["memory_method"]
    print(f"\nshape {args.shape} on {device}: batch {spec['prompts']} prompts x {spec['generations']} generations, "
          f"completions forced to {spec['completion_len']} tokens, {steps} steps per arm (first excluded), "
          f"{args.repeats} run(s) per arm, order rotated; medians; peak memory: {memory_method}")
    print(f"{'arm':50} {'s/step':>8} {'outside gen s':>14} {'peak GiB':>9} {'tokens/s':>9}")
    for arm, f in figures.items():
        print(f"{ARM_NAMES[arm]:50} {f['s_per_step']:8.2f} {f['outside_generation_s']:14.2f} "
              f"{f['peak_memory_gib']:9.2f} {f['completion_tokens_per_s']:9.1f}")
    if "full" in figures and "time/sdpo_s" in figures["full"]:
        full = figures["full"]
        print(f"full arm's channels per step: hint distillation {full['time/sdpo_s']:.2f} s, trace replay "
              f"{full.get('time/replay_s', float('nan')):.2f} s (metrics time/sdpo_s, time/replay_s)")
    print("loadavg (1 min) before -> after each arm: " + ", ".join(f"{a} {b:.2f}->{c:.2f}" for a, b, c in loads))

    def ratio(a: str, b: str) -> dict[str, float] | None:
        if a not in figures or b not in figures:
            return None
        return {"s_per_step": round(figures[a]["s_per_step"] / figures[b]["s_per_step"], 3),
                "outside_generation_s": round(figures[a]["outside_generation_s"] / figures[b]["outside_generation_s"], 3),
                "peak_memory": round(figures[a]["peak_memory_gib"] / figures[b]["peak_memory_gib"], 3)}

    out = {"benchmark": "trainer_overhead", "shape": args.shape, "device": device, "memory": memory_method,
           "steps_per_arm": steps, "repeats": args.repeats, "concurrent": args.concurrent,
           "arms": {arm: {k: round(v, 4) for k, v in f.items()} for arm, f in figures.items()},
           "per_run": per_run, "loadavg": loads, "tree": str(tree),
           "provenance": record, "grpo_vs_trl": ratio("grpo", "trl"), "full_vs_grpo": ratio("full", "grpo")}
    for name in ("grpo_vs_trl", "full_vs_grpo"):
        if out[name] is not None:
            print(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in out[name].items()))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
