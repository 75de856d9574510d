"""The debate through OpenEnv's harness runtime (``openenv-core`` 0.3.0, RFC 005): OpenEnv's own
``CollectRunner`` and ``MCPHarnessAdapter`` drive our ``DebateSessionFactory`` against a real server,
played by the scripted debate model step. The rewards in ``results.jsonl`` are the server's
records of the same episodes; a model's mistakes are tool errors and the debate goes on; a
server killed mid-debate and restarted on its state directory loses no episode, and one that
stays down gets its debates written as failed. (OpenEnv 0.10's runtime: ``test_openenv010.py``;
a model behind ``vllm serve``: ``test_vllm_cpu.py``.)
"""

from __future__ import annotations

import json
import signal
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest
from openenv.core.harness import HarnessRunLimits, MCPHarnessAdapter, ModelStepResult
from openenv.core.harness.collect import CollectRunner, RolloutSerializer
from openenv.core.llm_client import LLMResponse, ToolCall
from reliability_helpers import killable_server

from env_server.cli import free_port
from env_server.debate.problems import load_problem_source
from trainer_client.rollout.environment import shared_client
from trainer_client.rollout.harness import DebateSessionFactory, scripted_model_step
from trainer_client.rollout.tools import DEBATE_SYSTEM_PROMPT

SEEDS = list(range(6))
LIMITS = HarnessRunLimits(max_turns=10)


def _server_reward(url: str, episode_id: str) -> float:
    with urllib.request.urlopen(f"{url}/episodes/{episode_id}/rewards", timeout=10) as response:
        status = json.loads(response.read())
    assert status["status"] == "graded"
    return float(status["record"]["episode_reward"])


def _collect(factory: DebateSessionFactory, out: Path, step, seeds=SEEDS, limits=LIMITS):
    runner = CollectRunner(session_factory=factory, harness_adapter=MCPHarnessAdapter(),
                           serializer=RolloutSerializer(out), tasks=seeds, limits=limits)
    return runner.run(model_step=step, num_episodes=len(seeds))


def _records(out: Path) -> list[dict]:
    path = out / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_mcp_tools_are_the_schemas_the_model_was_trained_on() -> None:
    from trainer_client.rollout.harness import debate_tools
    from trainer_client.rollout.tool_calls import tool_schemas

    trained = [schema["function"] for schema in tool_schemas()]  # transformers' get_json_schema, TRL's order
    assert [(t.name, t.description, t.input_schema) for t in debate_tools()] == [
        (f["name"], f["description"], f["parameters"]) for f in trained]


def test_a_task_is_a_seed_a_mapping_or_a_runtimes_row_with_a_seed() -> None:
    from trainer_client.rollout.harness import _task_reset

    assert _task_reset(7, None) == {"seed": 7} and _task_reset(None, 3) == {"seed": 3} and _task_reset(None, None) == {}
    assert _task_reset({"problem_id": "p1", "seed": None}, None) == {"problem_id": "p1"}
    # TRL's async GRPO: create(prompt, seed=group_id, episode_id=...): the group's seed decides
    assert _task_reset([{"role": "user", "content": "solve"}], 4) == {"seed": 4}
    for bad in ("a prompt", [1], True, {"answer": "2"}):
        with pytest.raises(TypeError):
            _task_reset(bad, None)


def test_collect_runner_rewards_are_the_servers_records(server_url, tmp_path) -> None:
    factory = DebateSessionFactory(server_url, max_rounds=1, failures_path=tmp_path / "failed.jsonl")
    result = _collect(factory, tmp_path / "out", scripted_model_step(load_problem_source(None), SEEDS, p=0.5))
    records = _records(tmp_path / "out")
    server = [_server_reward(server_url, r["artifacts"]["server_episode_id"]) for r in records]
    assert (result.num_collected, result.num_failed) == (len(SEEDS), 0)
    assert [r["reward"] for r in records] == server and 0.0 in server and 1.0 in server
    assert [r["task"] for r in records] == SEEDS
    for record in records:
        assert record["messages"][0] == {"role": "system", "content": DEBATE_SYSTEM_PROMPT}
        assert record["messages"][1]["content"].startswith("[SOLVER]")
        # the reward travels once: in the result of the call that ended the debate, and in verify
        rewards = [e["result"]["metadata"].get("reward") for e in record["tool_trace"]]
        assert rewards[:-1] == [None] * (len(rewards) - 1) and rewards[-1] == record["reward"]
        assert record["verify_metrics"]["final_answer_correct"] == (record["reward"] == 1.0)
        assert [e["tool_name"] for e in record["tool_trace"]] == ["submit_solution", "submit_verdict",
                                                                  "submit_final_answer"]
    assert not (tmp_path / "failed.jsonl").exists()


def _with_mistakes(step):
    """Before each right call: an unknown tool, then the role's tool with a missing argument, then
    another role's tool; the scripted call last."""
    mistakes: dict[tuple[str, int], int] = {}

    def model_step(messages, tools, sampling):
        accepted = sum(m.get("role") == "tool" and m["content"].startswith("[") for m in messages)
        turn = (messages[1]["content"], accepted)  # (the debate's problem, its accepted turns)
        made = mistakes.get(turn, 0)
        mistakes[turn] = made + 1
        right = step(messages, tools, sampling)
        call = right.response.tool_calls[0]
        bad = [ToolCall("x0", "get_answer", {"q": 1}), ToolCall("x1", call.name, {}),
               ToolCall("x2", "submit_final_answer" if call.name != "submit_final_answer" else "submit_solution",
                        {"answer": "1"} if call.name != "submit_final_answer" else {"solution": "1"})]
        if made < len(bad):
            return ModelStepResult(response=LLMResponse(content="", tool_calls=[bad[made]]))
        return right

    return model_step


def test_a_models_mistakes_are_tool_errors_and_the_debate_goes_on(server_url, tmp_path) -> None:
    seeds = SEEDS[:2]
    factory = DebateSessionFactory(server_url, max_rounds=1)
    step = _with_mistakes(scripted_model_step(load_problem_source(None), seeds, policy="reference"))
    result = _collect(factory, tmp_path / "out", step, seeds, HarnessRunLimits(max_turns=12))
    records = _records(tmp_path / "out")
    server = [_server_reward(server_url, r["artifacts"]["server_episode_id"]) for r in records]
    assert (result.num_collected, result.num_failed) == (2, 0)
    assert [r["reward"] for r in records] == server == [1.0, 1.0]  # the reference debaters are right
    for record in records:
        errors = [e["result"]["error"] for e in record["tool_trace"] if e["result"]["error"]]
        assert len(errors) == 9, "\n".join(errors)  # three mistakes before each of the three turns; none consumed a turn
        assert any(e.startswith("unknown tool 'get_answer'") for e in errors)
        assert any("takes the arguments" in e for e in errors) and any("turn: call" in e for e in errors)
        assert record["verify_metrics"]["turns"] == 3 and record["verify_metrics"]["forfeited_turns"] == 0


def test_a_server_killed_mid_debate_loses_no_episode_and_one_that_stays_down_is_written_as_failed(tmp_path) -> None:
    port, state = free_port(), tmp_path / "state"
    url = f"http://127.0.0.1:{port}"
    source = load_problem_source(None)
    with ExitStack() as stack:
        first = stack.enter_context(killable_server(port, "--state-dir", str(state)))
        scripted = scripted_model_step(source, SEEDS[:3])
        calls = {"n": 0}

        def restart_once(messages, tools, sampling):
            calls["n"] += 1
            if calls["n"] == 5:  # the second debate's verifier turn: its solver turn is in the journal
                first.send_signal(signal.SIGKILL)
                first.wait(timeout=30)
                stack.enter_context(killable_server(port, "--state-dir", str(state)))
            return scripted(messages, tools, sampling)

        factory = DebateSessionFactory(url, max_rounds=1, failures_path=tmp_path / "failed.jsonl")
        result = _collect(factory, tmp_path / "restarted", restart_once, SEEDS[:3])
        records = _records(tmp_path / "restarted")
        assert (result.num_collected, result.num_failed) == (3, 0) and calls["n"] == 9
        assert shared_client(url).reruns == 0  # re-attached to the restarted server's session, not re-run
        assert [r["reward"] for r in records] == [_server_reward(url, r["artifacts"]["server_episode_id"])
                                                  for r in records]
    assert not (tmp_path / "failed.jsonl").exists()

    # a server that stays down: the debate in flight and the next are failures, written down
    port = free_port()
    with killable_server(port) as server:
        calls["n"] = 0

        def kill_once(messages, tools, sampling):
            calls["n"] += 1
            if calls["n"] == 5:
                server.send_signal(signal.SIGKILL)
                server.wait(timeout=30)
            return scripted(messages, tools, sampling)

        factory = DebateSessionFactory(f"http://127.0.0.1:{port}", max_rounds=1, rerun_after_s=2,
                                       failures_path=tmp_path / "down-failed.jsonl")
        result = _collect(factory, tmp_path / "down", kill_once, SEEDS[:3])
    assert (result.num_collected, result.num_failed) == (1, 2)
    failed = [json.loads(line) for line in (tmp_path / "down-failed.jsonl").read_text().splitlines()]
    assert [(f["episode_id"], f["task"]) for f in failed] == [("ep-000001", {"seed": 1}), ("ep-000002", {"seed": 2})]
    assert failed[0]["during"] == "submit_verdict" and failed[0]["server_episode_id"]
    assert failed[1]["during"] == "reset" and all(f["error"] for f in failed)
