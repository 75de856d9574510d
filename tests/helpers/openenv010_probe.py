"""Run inside a virtual environment with ``openenv==0.10.x`` (``tests/e2e/test_openenv010.py`` makes
it): play the stock 0.10 client against a running server, and run openenv's own runtime-level
collector and graders on the repository's manifest and runtime plan against that server.

Usage: ``python openenv010_probe.py BASE_URL REPO_ROOT``; prints one JSON object.

``openenv validate``'s runtime level builds and starts an image first (Docker); this probe
feeds the same collector (``collect_runtime_evidence``: reset, state, alternating step/state
over ``/ws``, the plan in ``validation/runtime.json``) and the same graders
(``runtime.reward_well_formed``, ``runtime.observation_schema``, ``runtime.state_contract``) the
already running server instead. It imports nothing from mathdebate.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace


def play_with_stock_client(url: str) -> dict:
    import uuid

    from openenv.core.generic_client import GenericEnvClient

    steps = []
    with GenericEnvClient(base_url=url).sync() as env:
        result = env.reset(seed=5, episode_id=f"openenv010-{uuid.uuid4().hex}")
        steps.append({"reward": result.reward, "done": result.done, "role": result.observation.get("role")})
        for action in ({"role": "solver", "content": "So the answer is $\\boxed{-1}$."},
                       {"role": "verifier", "content": "VERDICT: INCORRECT"},
                       {"role": "solver", "content": "Again: $\\boxed{-2}$."},
                       {"role": "verifier", "content": "VERDICT: INCORRECT"},
                       {"role": "judge", "content": "$\\boxed{-2}$"}):
            result = env.step(action)
            steps.append({"reward": result.reward, "done": result.done, "role": result.observation.get("role"),
                          "metadata": getattr(result, "metadata", None) or result.observation.get("metadata")})
            if result.done:
                break
        state = env.state()
    return {"steps": steps, "state": state if isinstance(state, dict) else state.model_dump()}


def runtime_graders(url: str, root: Path) -> dict:
    from openenv.validation.graders.runtime.basic import (
        ObservationSchemaGrader,
        RewardWellFormedGrader,
        StateContractGrader,
    )
    from openenv.validation.parsers.openenv_yaml import OpenEnvYamlParser
    from openenv.validation.runtime.collector import collect_runtime_evidence
    from openenv.validation.runtime.contracts import load_runtime_plan

    manifest = OpenEnvYamlParser().parse(root)
    plan = load_runtime_plan(root, manifest.execution)
    evidence = collect_runtime_evidence(url, plan, episode_timeout_s=manifest.resources.episode_timeout_s)
    subject = SimpleNamespace(manifest=manifest, runtime_evidence=evidence)
    checks = {}
    for grader in (RewardWellFormedGrader(), ObservationSchemaGrader(), StateContractGrader()):
        result = grader.run(subject)
        checks[result.check_id] = {"status": result.status.value, "evidence": list(result.evidence)}
    return {"failure_reason": evidence.failure_reason, "exchanges": [e.operation for e in evidence.exchanges],
            "checks": checks}


def main() -> int:
    url, root = sys.argv[1], Path(sys.argv[2])
    from importlib.metadata import version

    print(json.dumps({"openenv_version": version("openenv"), "client": play_with_stock_client(url),
                      "runtime": runtime_graders(url, root)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
