"""The debate as a verifiers environment (``math_debate``, verifiers 0.4): verifiers' own
``vf-eval`` (from its own environment, ``tests/helpers/vf_eval.py``) plays debates on a real env
server, each turn through verifiers' chat harness (``null``, a local subprocess) against a real
OpenAI-compatible endpoint (the chat fixture: the ``oracle`` solver boxes the answer it knows).
Every score is the server's record; a problem whose gold changes on the server changes the score;
a server that is down gets every episode written with its error, and ``vf-eval --resume`` plays
them once the server is up (no episode lost). The same environment against ``vllm serve`` of the
tiny model, compared with ``mathdebate eval``: ``test_vllm_cpu.py``.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

import pytest
from openai_fixture import serve_chat_fixture
from vf_eval import episodes_by_problem, run_vf_eval

from env_server.cli import free_port, running_server

#: (problem, answer); the fixture's oracle answers with these.
PROBLEMS = [("Compute $12 + 30$.", "42"), ("Compute $7 + 8$.", "15")]
#: The answers another server grades against: the first problem's gold changed. (Two problems:
#: each turn is a rollout of verifiers' chat program, a new process, about 1.5 s of CPU here.)
CHANGED = ["43", "15"]


def _problems_file(path: Path, answers: list[str]) -> Path:
    path.write_text("".join(json.dumps({"problem": problem, "answer": answer, "unique_id": f"vf/{i}"}) + "\n"
                            for i, ((problem, _), answer) in enumerate(zip(PROBLEMS, answers, strict=True))))
    return path


def _run(out: Path, name: str, url: str, problems: Path, endpoint: str) -> Path:
    run_vf_eval("math-debate", "--env.url", url, "--env.taskset.problems", str(problems),
                "--env.taskset.limit", str(len(PROBLEMS)), "--model", "oracle", "--client.base-url", endpoint,
                "--sampling.temperature", "0", "--sampling.max-tokens", "64", "-o", str(out), "--run.name", name)
    return out / name


def _server_record(url: str, episode_id: str) -> dict:
    with urllib.request.urlopen(f"{url}/episodes/{episode_id}/rewards", timeout=10) as response:
        status = json.loads(response.read())
    assert status["status"] == "graded"
    return status["record"]


def _check_scores(url: str, episodes: dict[str, dict], answers: list[str]) -> None:
    """Every episode finished, every trace's reward and metrics are the server's record of its
    debate, and the first answer (the oracle's, the fixture's own gold) is right exactly where
    the server's gold is that answer."""
    assert sorted(episodes) == [f"vf/{i}" for i in range(len(PROBLEMS))]
    for i, (_, known) in enumerate(PROBLEMS):
        episode = episodes[f"vf/{i}"]
        assert episode["ok"] and not episode["errors"], episode["errors"]
        traces = episode["traces"]
        assert [t["agent"]["name"] for t in traces][:2] == ["solver", "verifier"] and traces[-1]["agent"]["name"] == "judge"
        assert [t["agent"]["trainable"] for t in traces] == [t["agent"]["name"] != "judge" for t in traces]
        first = traces[0]
        assert first["task"]["data"]["prompt"][1]["content"] == PROBLEMS[i][0]  # the server's chat for the solver
        assert f"\\boxed{{{known}}}" in first["nodes"][-1]["message"]["content"]  # the oracle's reply ...
        record = _server_record(url, first["info"]["server_episode_id"])
        assert record["turns"][0]["answer"] == known  # ... is the action the server graded
        right = answers[i] == known
        assert record["facts"]["first_answer_correct"] is right
        for trace in traces:
            assert trace["info"]["server_episode_id"] == record["episode_id"]
            assert trace["rewards"]["reward"]["score"] == record["episode_reward"]
            assert trace["metrics"]["first_answer_correct"] == float(right)
            assert trace["metrics"]["turn_reward"] == record["turns"][trace["info"]["t"]]["reward"]


@pytest.mark.slow
@pytest.mark.timeout(600)  # the first run builds verifiers' environment (tests/helpers/vf_eval.py): a minute or more cold
def test_vf_eval_scores_debates_by_the_servers_grading_and_resumes_a_server_that_was_down(tmp_path) -> None:
    true_gold = _problems_file(tmp_path / "gold.jsonl", [answer for _, answer in PROBLEMS])
    changed_gold = _problems_file(tmp_path / "changed.jsonl", CHANGED)
    with serve_chat_fixture({problem: answer for problem, answer in PROBLEMS}) as (endpoint, fixture):
        with running_server(["--problems", str(true_gold)]) as url:
            run = _run(tmp_path, "true-gold", url, true_gold, endpoint)
            _check_scores(url, episodes_by_problem(run), [answer for _, answer in PROBLEMS])
        solver_requests = fixture.requests["oracle"]
        # the same problems on a server whose gold changed for two of them: down first ...
        port = free_port()
        down = f"http://127.0.0.1:{port}"
        run = _run(tmp_path, "changed-gold", down, true_gold, endpoint)
        episodes = episodes_by_problem(run)
        assert sorted(episodes) == [f"vf/{i}" for i in range(len(PROBLEMS))]  # every episode written, with its error
        for episode in episodes.values():
            assert not episode["ok"] and "no env replica accepted a session" in episode["errors"][-1]["message"]
        assert fixture.requests["oracle"] == solver_requests  # no model call for a debate that never started
        # ... then up: vf-eval --resume plays the errored episodes, scored by this server's gold
        with running_server(["--problems", str(changed_gold)], port=port) as url:
            run_vf_eval("@", str(run / "configs" / "resolved" / "eval.json"), "--resume")
            episodes = episodes_by_problem(run)
            _check_scores(url, episodes, CHANGED)
    assert [episodes[f"vf/{i}"]["traces"][0]["metrics"]["first_answer_correct"] for i in range(2)] == [0, 1]


#: Run in the verifiers environment: load_environment's tasks, and a setting of the wrong kind.
LOAD_PROBE = """
import json, sys, pydantic, math_debate
env = math_debate.load_environment(url="http://127.0.0.1:1", problems="gen:two_digit_sum", limit=5, seed=7,
                                   max_rounds=1)
try:
    math_debate.load_environment(reward="both")
    refused = None
except pydantic.ValidationError as exc:
    refused = exc.errors()[0]["loc"]
print(json.dumps({"type": type(env).__name__, "tasks": [t.data.problem_id for t in env.taskset],
                  "max_rounds": env.config.max_rounds, "judge_harness": env.config.judge.harness.id,
                  "refused": refused}))
"""


def test_load_environment_builds_the_debate_env_on_the_problems_eval_uses() -> None:
    """``math_debate.load_environment`` (through verifiers' own loader) gives the ``DebateEnv``
    whose tasks are ``mathdebate eval``'s problems in its order (``by_seed(seed + i)``); a
    setting of the wrong kind is pydantic's error, named."""
    from vf_eval import verifiers_bin

    from env_server.debate.problems import load_problem_source

    done = subprocess.run([str(verifiers_bin() / "python"), "-c", LOAD_PROBE], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    source = load_problem_source("gen:two_digit_sum")
    assert loaded == {"type": "DebateEnv", "tasks": [source.by_seed(7 + i).problem_id for i in range(5)],
                      "max_rounds": 1, "judge_harness": "null", "refused": ["reward"]}
