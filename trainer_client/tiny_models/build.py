"""The offline tiny model: tokenizer, Qwen2 config and a short tool-call warm-up, all local.

Tests and the CPU demo must not download anything. A randomly initialised model never emits a
tool call, so every debate would be forfeited and every reward equal (no learning signal).
``build_tiny_model`` therefore also runs a short supervised warm-up on synthetic debates,
built with the real environment code (``DebateEpisode`` and the adapter's
``render_instructions``) and tokenised exactly as TRL's tool loop lays out a rollout: the
prompt with the tool schemas, then per turn the model's tool call and TRL's tool-result
suffix. After it, sampling at temperature 1 mostly yields well-formed calls to the right tool,
with arbitrary answers, so rewards vary. The default model's warm-up also holds single-mode
episodes (RFC 0006, ``TrainConfig.mode: single``); the learning experiment's holds debates only.

Recipe from TRL's own tests (see shared/reference/trl-notes.md §4): ByteLevel BPE with the
Qwen special tokens, TRL's bundled ``qwen3.jinja`` chat template (TRL parses tool calls only
for templates it recognises), ``Qwen2ForCausalLM`` with a tiny config.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer_client.rollout.chat_template import tool_result_suffix, training_chat_template
from trainer_client.rollout.tool_calls import tool_callables
from trainer_client.tiny_models.recipes import (
    TinyModelSpec,
    default_spec,
    tiny_model_spec,
)
from trainer_client.tiny_models.warmup_debates import HINT_MESSAGE, synthetic_debates

__all__ = ["BUILD_FILES", "PINNED_DIR", "build_tiny_model", "drill_tokens", "pinned_build", "rollout_tokens", "supervised_steps",
           "tiny_model_main", "tiny_model_path", "tiny_models_cache"]

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>"]


def _train_tokenizer(texts: list[str], vocab_size: int, chat_template: str, phrase_tokens: bool = False):
    """A byte-level BPE tokenizer. ``phrase_tokens``: no split on spaces or punctuation (only each
    digit stands alone), so BPE merges the prompt's fixed phrases (instructions, tool schemas) into
    long tokens: the solver's prompt shrinks from ~540 to ~85 tokens, and a 2-layer model's attention
    finds the problem among far fewer positions (and runs ~6x faster)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    if phrase_tokens:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    wrapped.chat_template = chat_template
    return wrapped


def drill_tokens(tokenizer, text: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Token ids of a drill (:func:`~trainer_client.tiny_models.warmup_debates.division_fact_drills`),
    tokenized whole, and a 0/1 mask of the tokens inside ``spans`` (the answer digits: a
    phrase-token tokenizer gives each digit a token of its own, so a span is whole tokens), then
    the end-of-text token (masked 0)."""
    encoded = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    mask = [int(any(lo <= start and end <= hi for lo, hi in spans)) for start, end in encoded["offset_mapping"]]
    return [*encoded["input_ids"], tokenizer.pad_token_id], [*mask, 0]


def rollout_tokens(tokenizer, messages: list[dict[str, Any]], tools: list[Any]) -> tuple[list[int], list[int]]:
    """Token ids of a debate laid out as TRL's tool loop lays it out, and a 0/1 mask of the
    model's own tokens (its messages and their end-of-turn token).

    The prompt and every tool-result suffix are rendered with :func:`training_chat_template`,
    the template TRL renders rollouts with (a tokenizer's own ``qwen3.jinja`` renders an empty
    ``<think>`` block on a final assistant message, which made the suffixes here drop the
    ``<|im_start|>user\n<tool_response>`` header that TRL's rollouts carry)."""
    template = training_chat_template(tokenizer)
    prompt = list(tokenizer.apply_chat_template(messages[:2], tools=tools, add_generation_prompt=True, tokenize=True,
                                                return_dict=False, chat_template=template))
    ids, mask = prompt, [0] * len(prompt)
    eos = tokenizer.eos_token_id
    i = 2
    while i < len(messages):
        message = messages[i]
        if message.get(HINT_MESSAGE):  # a hint before the next turn, laid out as SDPO's teacher context
            from trainer_client.losses.hint_distillation import hint_message_ids

            generation_prompt, inserted = hint_message_ids(tokenizer, message["content"], chat_template=template)
            if ids[len(ids) - len(generation_prompt):] != generation_prompt:
                raise ValueError("a hint must follow a generation prompt (the prompt or a tool result)")
            ids, mask = ids[: len(ids) - len(generation_prompt)] + inserted, mask[: len(mask) - len(generation_prompt)]
            mask = mask + [0] * len(inserted)
            i += 1
            continue
        if message.get("tool_calls"):
            call = message["tool_calls"][0]["function"]
            text = ('<tool_call>\n{"name": "' + call["name"] + '", "arguments": ' + json.dumps(call["arguments"])
                    + "}\n</tool_call>")
        else:
            text = message["content"]
        own = [*tokenizer(text, add_special_tokens=False)["input_ids"], eos]
        ids, mask = ids + own, mask + [1] * len(own)
        if i + 1 < len(messages) and messages[i + 1]["role"] == "tool":
            suffix = tool_result_suffix(tokenizer, messages[i + 1], template)
            ids, mask = ids + suffix, mask + [0] * len(suffix)
            i += 2
        else:
            i += 1
    return ids, mask


#: Spec fields added after a spec was published, with the value that means "as before": a spec
#: at that value hashes as if the field were absent, so its cached builds stay valid.
_HASH_NEUTRAL: dict[str, Any] = {"single_episodes": 0}


def _spec_hash(spec: TinyModelSpec) -> str:
    """The build-cache key of a spec: 16 hex digits of the SHA-256 of its sorted JSON, fields of
    :data:`_HASH_NEUTRAL` at their neutral value left out."""
    kept = {k: v for k, v in spec.items() if not (k in _HASH_NEUTRAL and v == _HASH_NEUTRAL[k])}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


#: The committed builds of the tiny models: one folder each (``config.json``,
#: ``model.safetensors``, the tokenizer files and ``tiny_model.json`` with the spec, its hash, the
#: weights' fingerprint and the torch version and thread count that built it). The warm-up's
#: floating-point sums depend on the thread count and the CPU (the same ``sums_spec(0)`` built to
#: 7.5% greedy accuracy with 1 thread and 21.5% with 2 on one machine, 44% on another), so a
#: protocol's starting policy is these files, not a rebuild: :func:`build_tiny_model` and
#: :func:`tiny_model_path` take a spec's committed build when its hash matches, and
#: ``scripts/rebuild_tiny_models.py`` rebuilds from the recipe (``pinned=False``) to check how far
#: a rebuild lands from it.
PINNED_DIR = Path(__file__).resolve().parent / "pinned"
#: The files of a build (what is committed and what is copied out of :data:`PINNED_DIR`).
BUILD_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "chat_template.jinja", "special_tokens_map.json", "tiny_model.json")


def pinned_build(spec: TinyModelSpec) -> Path | None:
    """The committed build of ``spec`` (the folder under :data:`PINNED_DIR` whose
    ``tiny_model.json`` has ``spec``'s hash), or ``None``."""
    wanted = _spec_hash(spec)
    for marker in sorted(PINNED_DIR.glob("*/tiny_model.json")):
        if json.loads(marker.read_text()).get("hash") == wanted:
            return marker.parent
    return None


def build_tiny_model(out_dir: str | Path, spec: TinyModelSpec | None = None, progress: bool = False,
                     monitor: Callable[[int, Any, Any], None] | None = None, pinned: bool = True,
                     why: str = "no committed build of its recipe", kept_in: Path | None = None) -> Path:
    """Build (or reuse) the tiny model and tokenizer in ``out_dir``.

    A build that trains says so first, in one line on stderr (what it builds, why, how many
    warm-up steps, where it is kept for the next run), then shows a progress bar over the warm-up
    steps (tqdm; on a terminal, or always with ``progress``).

    Args:
        out_dir: destination; a build with the same spec found there is reused as is.
        spec: build parameters (default :func:`default_spec`).
        progress: show the warm-up's progress bar (with its loss) even when stderr is not a terminal.
        monitor: called as ``monitor(step, model, tokenizer)`` after every warm-up step (for
            learning curves; it must leave the model in training mode). A monitored build
            always trains.
        pinned: copy the spec's committed build (:func:`pinned_build`) when there is one,
            instead of training (``False``: train from the recipe, as the rebuild script does).
        why: why this model is built rather than loaded, for the announcing line.
        kept_in: where the build will be kept, for that line (default ``out_dir``).

    Returns:
        ``out_dir`` (loadable with ``AutoModelForCausalLM``/``AutoTokenizer.from_pretrained``).
    """
    import shutil

    import torch
    import trl
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    spec = spec or default_spec()
    out_dir = Path(out_dir)
    marker = out_dir / "tiny_model.json"
    committed = pinned_build(spec) if pinned and monitor is None else None
    if marker.exists():
        found = json.loads(marker.read_text())
        # an earlier local build of a recipe that has since been committed gives way to the committed one
        if found.get("hash") == _spec_hash(spec) and (committed is None or found.get("fingerprint") == json.loads(
                (committed / "tiny_model.json").read_text()).get("fingerprint")):
            return out_dir
    if committed is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        # each file whole or not at all (copied beside it, then renamed), the marker last: processes
        # copying into one folder at once (test workers) never read half a file or an early marker
        for name in sorted(BUILD_FILES, key=lambda n: n == "tiny_model.json"):
            if (committed / name).exists():
                partial = out_dir / f".{name}.{os.getpid()}"
                shutil.copyfile(committed / name, partial)
                os.replace(partial, out_dir / name)
        return out_dir

    torch.manual_seed(spec["seed"])
    conversations, singles = _warm_up_conversations(spec)
    print(f"mathdebate: building a tiny model ({why}): {spec['sft_steps']} warm-up steps on "
          f"{len(conversations) + len(singles)} scripted episodes"
          + (f" and {spec['fact_drills']} fact drills" if spec.get("fact_drills") else "")
          + f", kept in {kept_in or out_dir} for later runs",
          file=sys.stderr, flush=True)
    chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    tools = tool_callables()
    # Train the tokenizer on the text the model will see: prompts with tool schemas and turns.
    bootstrap = _train_tokenizer(SPECIAL_TOKENS, 300, chat_template)
    phrase_tokens = bool(spec.get("phrase_tokens", False))
    template = training_chat_template(bootstrap)
    # (a few single-mode episodes too, when there are any, so that their prompt has tokens of its own)
    corpus = [bootstrap.apply_chat_template(c, tools=tools, tokenize=False, chat_template=template)
              for c in conversations[:200 if phrase_tokens else 60] + singles[:10]]
    tokenizer = _train_tokenizer(corpus, spec["vocab_size"], chat_template, phrase_tokens=phrase_tokens)

    # A phrase-token tokenizer needs an architecture whose AutoTokenizer mapping loads tokenizer.json
    # as saved: transformers 5 rebuilds a qwen2 model's tokenizer as Qwen2Tokenizer, with Qwen's
    # word-splitting pre-tokenizer, which these merges were not learned for. Llama (Qwen2 without
    # the q/k/v biases) loads it as saved.
    sizes = dict(
        vocab_size=len(tokenizer), hidden_size=spec["hidden_size"], num_hidden_layers=spec["layers"],
        num_attention_heads=spec["heads"], num_key_value_heads=spec["kv_heads"],
        intermediate_size=spec["intermediate_size"], max_position_embeddings=spec["max_positions"],
        bos_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(LlamaConfig(**sizes)) if phrase_tokens else Qwen2ForCausalLM(Qwen2Config(**sizes))
    examples = [rollout_tokens(tokenizer, c, tools) for c in conversations + singles]
    if spec.get("fact_drills"):  # short drills of the family's facts beside the episodes (tiny-div v2)
        from trainer_client.tiny_models.warmup_debates import division_fact_drills

        examples += [drill_tokens(tokenizer, text, spans) for text, spans in
                     division_fact_drills(spec["fact_drills"], spec["seed"] + 2)]
    _warm_up(model, examples, tokenizer.pad_token_id, spec, progress,
             None if monitor is None else lambda step: monitor(step, model, tokenizer))

    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    from trainer_client.model.fingerprint import weights_fingerprint

    marker.write_text(json.dumps({"hash": _spec_hash(spec), "spec": spec, "fingerprint": weights_fingerprint(model),
                                  "built_with": {"torch": torch.__version__, "threads": torch.get_num_threads()}},
                                 indent=2))
    return out_dir


def _warm_up_conversations(spec: TinyModelSpec) -> tuple[list[list[dict[str, Any]]], list[list[dict[str, Any]]]]:
    """A spec's warm-up conversations: ``spec["debates"]`` debates, and ``spec["single_episodes"]``
    (default 0) single-mode episodes on the problems that follow the debates' (same family or
    rotation, scripted actions seeded with ``seed + 1``)."""
    first_seed = (10_000 + spec["seed"] * 100_000 if "warmup_seed_base" not in spec
                  else spec["warmup_seed_base"] + spec["seed"] * 10**6)

    def play(n: int, seed: int, seed_base: int, mode: str) -> list[list[dict[str, Any]]]:
        return synthetic_debates(n, seed, family=spec.get("family"), answer_accuracy=spec.get("answer_accuracy", 0.5),
                                 wrong_answers=spec.get("wrong_answers"), seed_base=seed_base,
                                 worked=spec.get("worked", False), restate=spec.get("restate", False), mode=mode,
                                 hint_fraction=spec.get("hint_fraction", 0.0),
                                 verdict_accuracy=spec.get("verdict_accuracy", 0.5),
                                 hint_style=spec.get("hint_style", "template"),
                                 restate_hints=spec.get("restate_hints", False),
                                 verifier=spec.get("verifier", "coin"), judge=spec.get("judge", "copy"),
                                 verifier_accuracy=spec.get("verifier_accuracy", 1.0),
                                 hint_roles=spec.get("hint_roles"),
                                 max_rounds=spec.get("max_rounds", 1) if mode == "debate" else 1)

    debates = play(spec["debates"], spec["seed"], first_seed, "debate")
    n_single = spec.get("single_episodes", 0)
    singles = play(n_single, spec["seed"] + 1, first_seed + spec["debates"], "single") if n_single else []
    return debates, singles


def _warm_up(model, examples: list[tuple[list[int], list[int]]], pad_id: int, spec: TinyModelSpec,
             progress: bool, on_step: Callable[[int], None] | None = None) -> None:
    """Supervised warm-up on whole rollouts ``(tokens, mask)``: next-token loss on the model's
    own tokens only. (Training on short windows of the context was tried: the model then fails
    to call tools in full-length contexts.)"""
    import torch

    rng = random.Random(spec["seed"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec["learning_rate"], weight_decay=0.0)
    horizon = spec.get("sft_schedule_steps", spec["sft_steps"])  # the linear decay's length (>= sft_steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / horizon)
    from tqdm.auto import tqdm

    model.train()
    # on a terminal (disable=None hides it in a log file), or always when asked for
    bar = tqdm(total=spec["sft_steps"], desc="tiny-model warm-up", unit="step", disable=False if progress else None,
               mininterval=1.0)
    with bar:
        for step in range(spec["sft_steps"]):
            loss = _supervised_step(model, optimizer, rng.sample(examples, spec["batch_size"]), pad_id)
            schedule.step()
            bar.update(1)
            if step % 25 == 0:
                bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
            if on_step is not None:
                on_step(step + 1)
    model.train(False)  # inference mode (torch's eval mode)


def _supervised_step(model, optimizer, batch: list[tuple[list[int], list[int]]], pad_id: int):
    """One optimizer step of next-token loss on the masked tokens of ``batch`` (right-padded);
    returns the loss."""
    import torch

    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (ids, mask) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention[row, : len(ids)] = 1
        labels[row, : len(ids)] = torch.tensor([tok if m else -100 for tok, m in zip(ids, mask, strict=True)])
    loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss


def supervised_steps(model, examples: list[tuple[list[int], list[int]]], pad_id: int, *, learning_rate: float,
                     batch_size: int, seed: int = 0, seconds: float | None = None, steps: int | None = None) -> int:
    """Supervised steps on rollouts ``(tokens, mask)`` as the warm-up takes them (loss on the
    model's own tokens, AdamW, gradient clipping at 1), at a constant learning rate, until
    ``steps`` steps or ``seconds`` of wall-clock (whichever comes first; at least one bound).

    Returns:
        The number of steps taken. The model is left in inference mode.
    """
    import time

    import torch

    if seconds is None and steps is None:
        raise ValueError("supervised_steps needs a step count or a time budget")
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    model.train()
    deadline = None if seconds is None else time.perf_counter() + seconds
    taken = 0
    while (steps is None or taken < steps) and (deadline is None or time.perf_counter() < deadline):
        _supervised_step(model, optimizer, rng.sample(examples, min(batch_size, len(examples))), pad_id)
        taken += 1
    model.train(False)  # inference mode (torch's eval mode)
    return taken


#: The rollout layout of TRL's tool loop, public for other supervised trainers (``trainer_client.ablation.sft``).



def tiny_model_main(out_dir: str) -> int:
    """``mathdebate tiny-model DIR``: build (or reuse) and say where it is."""
    path = build_tiny_model(out_dir, progress=True)
    print(f"tiny model and tokenizer written to {path} (load with --model {path}, or use --model tiny)")
    return 0


def tiny_models_cache() -> Path:
    """Where built tiny models are kept for later runs: ``$MATHDEBATE_CACHE_DIR/tiny-models``, by
    default ``~/.cache/mathdebate/tiny-models`` (``$XDG_CACHE_HOME`` where set)."""
    root = os.environ.get("MATHDEBATE_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") \
        / "mathdebate"
    return Path(root) / "tiny-models"


def tiny_model_path(name: str, parent: Path, why: str | None = None) -> Path:
    """The offline tiny model ``name``: its committed build (:data:`PINNED_DIR`) when its recipe
    has one; else a build of its recipe already under ``parent`` (``parent/tiny-model`` for
    ``tiny``, ``parent/<name>`` for the others); else the build kept in :func:`tiny_models_cache`
    (``<name>-<recipe hash>``), made there first when missing, so that any later run reuses it.
    ``name`` is a key of ``TINY_MODELS`` or ``<key>@<seed>``, the same recipe warmed up with
    another seed (the tiny models' default trace-replay teachers,
    :func:`trainer_client.config.tiny_model_teachers`). ``why``: why it is needed, for the line a
    build prints.

    Raises:
        KeyError: an unknown name.
        ValueError: a seed that is not an integer.
    """
    spec = tiny_model_spec(name)
    committed = pinned_build(spec)
    if committed is not None:
        return committed
    local = parent / ("tiny-model" if name == "tiny" else name)
    marker = local / "tiny_model.json"
    if marker.is_file() and json.loads(marker.read_text()).get("hash") == _spec_hash(spec):
        return local
    cached = tiny_models_cache() / f"{name}-{_spec_hash(spec)[:12]}"
    if (cached / "tiny_model.json").is_file():
        return cached
    # built beside its final place and renamed into it, so that two runs building it at once
    # (test workers, ablation arms) never read a half-written folder: the first rename wins
    building = cached.with_name(f"{cached.name}.building-{os.getpid()}")
    build_tiny_model(building, spec, why=why or f"{name}: no committed build of its recipe", kept_in=cached)
    try:
        building.rename(cached)
    except OSError:  # another process finished first: keep its build
        import shutil

        shutil.rmtree(building, ignore_errors=True)
    return cached
