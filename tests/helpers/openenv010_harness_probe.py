"""Run inside the ``openenv==0.10.x`` virtual environment (``tests/e2e/test_openenv010.py`` makes
it): OpenEnv 0.10's own ``CollectRunner`` and ``MCPHarnessAdapter`` play debates through
mathdebate's harness session factory (``trainer_client.rollout.harness``, imported from the
repository: the 0.10 environment has the client's dependencies, not mathdebate's training stack),
driven by the scripted debate model step.

Usage: ``python openenv010_harness_probe.py BASE_URL REPO_ROOT OUT_DIR N``; prints one JSON object:
the OpenEnv version, the runner's counts and, per collected episode, its reward and the
server's episode id (the test compares them with the server's records).
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version


def main() -> None:
    url, root, out, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    sys.path.insert(0, root)
    from openenv.core.harness import HarnessRunLimits, MCPHarnessAdapter
    from openenv.core.harness.collect import CollectRunner, RolloutSerializer

    from env_server.debate.problems import load_problem_source
    from trainer_client.rollout.harness import DebateSessionFactory, scripted_model_step

    seeds = list(range(n))
    runner = CollectRunner(session_factory=DebateSessionFactory(url, max_rounds=1), harness_adapter=MCPHarnessAdapter(),
                           serializer=RolloutSerializer(out), tasks=seeds, limits=HarnessRunLimits(max_turns=8))
    result = runner.run(model_step=scripted_model_step(load_problem_source(None), seeds, p=0.5), num_episodes=n)
    with open(f"{out}/results.jsonl") as handle:
        records = [json.loads(line) for line in handle]
    print(json.dumps({"openenv": version("openenv"), "collected": result.num_collected, "failed": result.num_failed,
                      "episodes": [{"reward": r["reward"], "server_episode_id": r["artifacts"]["server_episode_id"]}
                                   for r in records]}))


if __name__ == "__main__":
    main()
