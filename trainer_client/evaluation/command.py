"""``mathdebate eval``: evaluate a policy (one for every role, or one per role) on a problem set.

    mathdebate eval --policy POLICY [--policy-solver P --policy-verifier P --policy-judge P]
        --problems PATH|builtin|gen:FAMILY --limit K --mode single|debate
        --strategy greedy|best_of_n|self_consistency --n N --concurrency C --output-dir DIR
        [--env-url URL]

Without ``--env-url`` it starts its own server on the problems (and stops it after). Problem
``i`` of the run is ``source.by_seed(--seed + i)``: the first K problems of a file in order.
Writes ``DIR/results.json`` and ``DIR/trajectories.jsonl``
(:mod:`~trainer_client.evaluation.results`) and prints a table.

Failures (``docs/failures.md``): an episode whose model request failed for good is not scored.
When any episode failed, the first line printed says how many and why (the server's own
message); when more than ``--max-failed-share`` (default 5%) of the model requests, or of the
episodes on the env server, failed, the command exits 3 after writing and printing its results,
with that share and the first failure on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from env_server.client.failures import DEFAULT_MAX_FAILED_SHARE, FAILED_RUN_EXIT_CODE
from env_server.protocol.markers import Role

__all__ = ["add_eval_command", "cmd_eval"]


def add_eval_command(sub: Any) -> None:
    """Register ``eval`` on the ``mathdebate`` parser."""
    p = sub.add_parser("eval", help="evaluate a policy (scripted, local HF model, OpenAI-compatible endpoint) "
                                    "on a problem set; writes results.json and trajectories.jsonl")
    p.add_argument("--policy", default=None,
                   help="every role's policy: scripted:reference | scripted:noisy[:P] | hf:PATH[#ADAPTER] | "
                        "openai:BASE_URL[#MODEL] | openai-tools:BASE_URL[#MODEL] (tool-call layout, for a model "
                        "trained by mathdebate train)")
    for role in Role:
        p.add_argument(f"--policy-{role.value}", default=None, help=f"the {role.value}'s policy (default: --policy)")
    p.add_argument("--model", default=None, help="model name for openai: policies whose spec has no #MODEL")
    p.add_argument("--api-key-env", default=None,
                   help="environment variable holding the endpoint's API key (never pass a key on the command line)")
    p.add_argument("--problems", default="builtin",
                   help="JSONL (MATH-500 / GSM8K format), hf:<dataset>[:<split>], gen:<family>[,...] or builtin")
    p.add_argument("--limit", type=int, default=100, help="number of problems (K)")
    p.add_argument("--seed", type=int, default=0, help="first problem seed, and the policies' seed")
    p.add_argument("--mode", choices=["debate", "single"], default="debate")
    p.add_argument("--strategy", choices=["greedy", "best_of_n", "self_consistency"], default="greedy")
    p.add_argument("--n", type=int, default=4, help="samples per problem (best_of_n, self_consistency)")
    p.add_argument("--temperature", type=float, default=None,
                   help="solver sampling temperature (default: 0 for greedy, 1 otherwise)")
    p.add_argument("--select", default="verifier",
                   help="best_of_n scorer: verifier (P(CORRECT) or acceptance rate) or reward:MODULE:FUNCTION")
    p.add_argument("--verifier-samples", type=int, default=4,
                   help="K verifier draws for the acceptance rate when the policy gives no log-probabilities")
    p.add_argument("--max-rounds", type=int, default=None)
    p.add_argument("--concurrency", type=int, default=8, help="episodes in flight")
    p.add_argument("--max-concurrent-requests", type=int, default=16, help="endpoint requests in flight, per policy")
    p.add_argument("--timeout", type=float, default=60.0, help="per endpoint request, seconds")
    p.add_argument("--retries", type=int, default=3,
                   help="retries of an endpoint request that failed (timeouts, dropped connections, 408/409/429/5xx; "
                        "the openai client's backoff); a request that still fails fails its episode, never scored")
    p.add_argument("--max-failed-share", type=float, default=DEFAULT_MAX_FAILED_SHARE,
                   help="exit 3 when more than this share of the model requests (or of the episodes on the env "
                        f"server) failed (default {DEFAULT_MAX_FAILED_SHARE:g})")
    p.add_argument("--max-new-tokens", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=16, help="a local model's generation batch")
    p.add_argument("--cost-per-million", type=float, nargs=2, default=(0.0, 0.0), metavar=("INPUT", "OUTPUT"),
                   help="price per million prompt and completion tokens, for the cost counter")
    p.add_argument("--output-dir", default="outputs/eval")
    p.add_argument("--env-url", default=None, help="a running server (default: start one on --problems)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    """Run ``mathdebate eval``; a bad policy, option, problems file or server is a ``UsageError`` (exit 2), 3 when
    more than ``--max-failed-share`` of the requests failed (after the results are written)."""
    import sys

    from env_server import cli as server_cli
    from env_server.protocol.models import AUTH_TOKEN_ENV
    from env_server.provenance import provenance, server_info
    from env_server.usage import UsageError, first_line
    from trainer_client.evaluation.policies import PolicyOptions
    from trainer_client.evaluation.results import failure_headline, print_table, summarise, write_outputs
    from trainer_client.evaluation.runner import EvalSettings, evaluate_problems
    from trainer_client.evaluation.specs import build_policies

    problems_spec = None if args.problems in ("builtin", "", None) else args.problems
    strategy = args.strategy
    temperature = args.temperature if args.temperature is not None else (0.0 if strategy == "greedy" else 1.0)
    if args.select != "verifier" and not args.select.startswith("reward:"):
        raise UsageError("--select is verifier or reward:MODULE:FUNCTION")
    if args.limit < 1 or args.n < 1:
        raise UsageError("--limit and --n must be at least 1")
    if not 0.0 <= args.max_failed_share <= 1.0:
        raise UsageError("--max-failed-share is a share in [0, 1]")
    source = server_cli.load_problems(problems_spec)
    if args.env_url:
        server_cli.require_play_servers(args.env_url, "--env-url")
    problems = [source.by_seed(args.seed + i) for i in range(args.limit)]
    roles = [Role.SOLVER] if args.mode == "single" else list(Role)
    if args.mode == "single" and strategy == "best_of_n" and args.select == "verifier":
        roles.append(Role.VERIFIER)
    options = PolicyOptions(source=source, seed=args.seed, model=args.model, api_key_env=args.api_key_env,
                            timeout_s=args.timeout, max_retries=args.retries,
                            max_concurrency=args.max_concurrent_requests, max_new_tokens=args.max_new_tokens,
                            cost_per_million=tuple(args.cost_per_million), batch_size=args.batch_size)
    try:
        policies = build_policies(args.policy, {r: getattr(args, f"policy_{r.value}") for r in Role}, options, roles)
    except (ValueError, OSError) as exc:  # a bad spec, a model that is not there, hf:DIR#ADAPTER without that adapter
        raise UsageError(f"--policy: {first_line(exc)}") from exc
    settings = EvalSettings(mode=args.mode, strategy=strategy, n=args.n, temperature=temperature, select=args.select,
                            verifier_samples=args.verifier_samples, max_rounds=args.max_rounds,
                            concurrency=args.concurrency)
    token = os.environ.get(AUTH_TOKEN_ENV)

    servers: list[dict[str, Any]] = []

    async def run(url: str) -> tuple[Any, Any]:
        servers.append(await asyncio.to_thread(server_info, url, token))  # while the server is up
        try:
            return await evaluate_problems(url, problems, policies, settings, token=token,
                                           progress=not args.no_progress)
        finally:
            for policy in {id(p): p for p in policies.values()}.values():
                await policy.aclose()

    start = time.perf_counter()
    if args.env_url:
        results, totals = asyncio.run(run(args.env_url))
    else:
        serve_args = ["--grading-workers", "1"] + (["--problems", problems_spec] if problems_spec else [])
        with server_cli.running_server(serve_args) as url:
            results, totals = asyncio.run(run(url))
    summary = summarise(results, settings, policies, totals, time.perf_counter() - start, options.cost_per_million)
    summary["provenance"] = {**provenance({k: v for k, v in vars(args).items() if k != "func"}), "env_servers": servers}
    out = Path(args.output_dir)
    write_outputs(out, summary, results, settings)
    headline = failure_headline(summary)
    if headline is not None:  # the first thing the user reads: how many failed, and why
        print(headline, flush=True)
    print_table(summary)
    print(json.dumps({k: summary[k] for k in ("accuracy", "accuracy_ci95", "n_problems", "scored_problems",
                                              "failed_problems", "mode", "strategy")}))
    print(f"results: {out / 'results.json'}\ntrajectories: {out / 'trajectories.jsonl'}")
    for tally, what in ((totals.requests, "model requests"), (totals.env, "episodes on the env server")):
        if tally.exceeds(args.max_failed_share):
            print(f"mathdebate eval: {tally.limit_message(what, args.max_failed_share, '--max-failed-share')}",
                  file=sys.stderr)
            return FAILED_RUN_EXIT_CODE
    return 0
