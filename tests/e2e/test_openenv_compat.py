"""OpenEnv compatibility: the real openenv-core 0.3.0 client plays whole episodes on /ws, and
the HTTP routes answer in OpenEnv's shapes."""

from __future__ import annotations

import json

import httpx
import pytest
import websockets
from openenv.core.generic_client import GenericEnvClient

from env_server.debate.problems import ProblemGenerator
from env_server.protocol.models import DebateObservation, DebateState, StepPayload

GENERATOR = ProblemGenerator()


def test_openenv_client_plays_whole_episodes(server_url) -> None:
    with GenericEnvClient(base_url=server_url).sync() as env:
        for seed, correct in [(1, True), (2, False), (3, True)]:
            problem = GENERATOR.by_seed(seed)
            result = env.reset(problem_id=problem.problem_id, episode_id=f"openenv-{seed}")
            assert result.observation["role"] == "solver" and result.reward is None and not result.done
            assert result.observation["episode_id"] == f"openenv-{seed}"
            answer = problem.answer if correct else "-123456789"
            result = env.step({"role": "solver", "content": rf"My answer: \boxed{{{answer}}}"})
            # sparse numeric step rewards (--step-reward sparse, the default): 0.0 until the last step
            assert result.observation["role"] == "verifier" and result.reward == 0.0
            result = env.step({"role": "verifier", "content": "VERDICT: CORRECT"})
            assert result.observation["role"] == "judge"
            result = env.step({"role": "judge", "content": rf"\boxed{{{answer}}}"})
            # the terminal observation carries the graded episode reward, as stock clients expect
            assert result.done and result.reward == (1.0 if correct else 0.0)
            state = env.state()
            assert state["episode_id"] == f"openenv-{seed}" and state["step_count"] == 3


def test_openenv_client_sees_errors_as_openenv_errors(server_url) -> None:
    with GenericEnvClient(base_url=server_url).sync() as env:
        env.reset(seed=4)
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            env.step({"role": "judge", "content": "too early"})
        result = env.step({"role": "solver", "content": r"\boxed{1}"})  # still the solver's turn
        assert result.observation["role"] == "verifier"


def _ws_url(server_url: str) -> str:
    return server_url.replace("http", "ws") + "/ws"


@pytest.mark.parametrize(
    ("frame", "code"),
    [("{oops", "INVALID_JSON"), ('{"type": "dance"}', "UNKNOWN_TYPE"), ('{"type": "step"}', "VALIDATION_ERROR"),
     ('{"type": "reset", "data": {}, "extra": 1}', "VALIDATION_ERROR"),
     ('{"type": "step", "data": {"role": "solver", "content": "x"}}', "EXECUTION_ERROR")],
)
def test_ws_error_codes_keep_the_socket_open(server_url, frame: str, code: str) -> None:
    async def main() -> None:
        async with websockets.connect(_ws_url(server_url)) as ws:
            await ws.send(frame)
            reply = json.loads(await ws.recv())
            assert reply["type"] == "error" and reply["data"]["code"] == code
            await ws.send(json.dumps({"type": "reset", "data": {"seed": 1}}))
            assert json.loads(await ws.recv())["type"] == "observation"

    import asyncio

    asyncio.run(main())


def test_ws_frames_have_openenv_shapes_plus_metadata(server_url) -> None:
    async def main() -> None:
        async with websockets.connect(_ws_url(server_url)) as ws:
            await ws.send(json.dumps({"type": "state"}))
            assert json.loads(await ws.recv()) == {"type": "state", "data": {"episode_id": None, "step_count": 0}}
            await ws.send(json.dumps({"type": "reset", "data": {"seed": 9, "unknown_key": 1}}))
            reply = json.loads(await ws.recv())
            assert set(reply) == {"type", "data"} and reply["type"] == "observation"
            payload = StepPayload.model_validate(reply["data"])
            DebateObservation.model_validate(payload.observation)
            assert payload.observation["metadata"] == payload.metadata
            assert payload.metadata["error_kind"] is None and "hint_template_key" in payload.metadata
            await ws.send(json.dumps({"type": "state"}))
            state = DebateState.model_validate(json.loads(await ws.recv())["data"])
            assert state.step_count == 0 and state.role == "solver"
            await ws.send(json.dumps({"type": "close"}))
            await ws.recv()  # no reply: the server closes with 1000

    import asyncio

    with pytest.raises(websockets.ConnectionClosedOK):
        asyncio.run(main())


def test_http_routes(server_url) -> None:
    with httpx.Client(base_url=server_url, timeout=30) as http:
        assert http.get("/health").json() == {"status": "healthy"}
        meta = http.get("/metadata").json()
        assert {"name", "description", "readme_content", "version", "author", "documentation_url"} <= set(meta)
        schema = http.get("/schema").json()
        assert set(schema) == {"action", "observation", "state"}
        assert http.post("/mcp", json={}).json()["jsonrpc"] == "2.0"
        assert http.get("/state").json() == {"episode_id": None, "step_count": 0}

        problem = GENERATOR.by_seed(12)
        first = http.post("/reset", json={"problem_id": problem.problem_id}).json()
        assert set(first) == {"observation", "reward", "done", "metadata"}
        episode_id = first["observation"]["episode_id"]
        bad = http.post("/step", json={"action": {"role": "verifier", "content": "x"}, "episode_id": episode_id})
        assert bad.status_code == 422 and bad.json()["detail"][0]["type"] == "role_mismatch"
        no_id = http.post("/step", json={"action": {"role": "solver", "content": "x"}})
        assert no_id.status_code == 422
        for role, content in [("solver", problem.solution), ("verifier", "VERDICT: CORRECT"),
                              ("judge", rf"\boxed{{{problem.answer}}}")]:
            step = http.post("/step", json={"action": {"role": role, "content": content}, "episode_id": episode_id})
            assert step.status_code == 200, step.text
        assert step.json()["done"] and step.json()["reward"] == 1.0
        assert http.get("/state", params={"episode_id": episode_id}).json()["graded"] is True
        replay = http.get("/state", params={"episode_id": episode_id, "t": 0})
        assert replay.json()["observation"] == first
        rewards = http.get(f"/episodes/{episode_id}/rewards")
        assert rewards.status_code == 200 and rewards.json()["record"]["episode_reward"] == 1.0
        assert http.get("/episodes/nope/rewards").status_code == 404
        hints = http.get("/hints").json()
        assert hints["solver/wrong_answer"] and all("/" in k for k in hints)
