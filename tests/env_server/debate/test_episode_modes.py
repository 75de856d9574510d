"""Episode modes (``debate``/``single``) and the circular-critique stop (RFC 0006): the state
machine and the record without a server, then every transport over a real socket."""

from __future__ import annotations

import asyncio
import json

import httpx
import orjson
import pytest
import websockets
from debate_steps import act, payload

from env_server.cli import _serve_config, build_parser, running_server
from env_server.client import MuxClient, MuxError, SyncMuxClient
from env_server.client.play import play
from env_server.debate.episode import DebateEpisode
from env_server.debate.problems import ProblemGenerator
from env_server.debate.problems.base import Problem
from env_server.debate.prompts import SINGLE_SOLVER_PROMPT
from env_server.debate.rewards import episode_rewards_data
from env_server.protocol.errors import EpisodeDoneError, InvalidActionError, OutOfRangeError
from env_server.protocol.grades import Grade
from env_server.protocol.markers import HINT_TEMPLATES, EpisodeMode, ErrorKind, Role
from env_server.protocol.models import EpisodeRewards, ResetRequest
from env_server.usage import UsageError

PROBLEM = Problem("p/1", "What is $6 \\times 7$?", "42", "6 times 7 is $\\boxed{42}$.")
GENERATOR = ProblemGenerator()
RIGHT, WRONG = Grade(True), Grade(False)
MISSING = Grade(False, ErrorKind.MISSING_FINAL_ANSWER, "rule")


def episode(mode: EpisodeMode = EpisodeMode.DEBATE, max_rounds: int = 3, circular_stop: bool = True) -> DebateEpisode:
    return DebateEpisode("e", PROBLEM, max_rounds=max_rounds, max_action_chars=1000, mode=mode,
                         circular_stop=circular_stop)


def record(ep: DebateEpisode, grades_by_answer: dict) -> EpisodeRewards:
    grades = {t.t: grades_by_answer[t.answer] for t in ep.turns if t.needs_grade}
    return EpisodeRewards.model_validate(episode_rewards_data(ep, grades, graded_at=1.0, session_id="s"))


# --------------------------------------------------------------------------- single mode


def test_single_mode_is_one_solver_turn_graded_alone() -> None:
    ep = episode(EpisodeMode.SINGLE, max_rounds=3)
    first = payload(ep.last_observation)["observation"]
    assert first["mode"] == "single" and first["role"] == "solver" and first["max_rounds"] == 1
    assert first["messages"] == [{"role": "system", "content": SINGLE_SOLVER_PROMPT},
                                 {"role": "user", "content": PROBLEM.problem}]
    assert "verifier" not in SINGLE_SOLVER_PROMPT and "debate" not in SINGLE_SOLVER_PROMPT
    with pytest.raises(InvalidActionError):
        act(ep, "verifier", "VERDICT: CORRECT")  # only the solver acts
    act(ep, "solver", r"so \boxed{42}")
    last = payload(ep.last_observation)
    assert ep.done and last["done"] and last["observation"]["role"] is None and last["observation"]["messages"] == []
    assert ep.state()["mode"] == "single" and ep.state()["step_count"] == 1
    with pytest.raises(EpisodeDoneError):
        act(ep, "judge", r"\boxed{42}")
    assert ep.observation_at(0) == ep._observations[0]
    with pytest.raises(OutOfRangeError):
        ep.observation_at(1)

    rec = record(ep, {"42": RIGHT})
    assert [(t.t, t.role, t.reward, t.error_kind, t.answer) for t in rec.turns] == [(0, Role.SOLVER, 1.0, None, "42")]
    assert rec.episode_reward == 1.0
    assert rec.facts.model_dump() == {
        "first_answer_correct": True, "last_solver_answer_correct": True, "final_answer_correct": True,
        "judge_correct": None, "verifier_accepted": None, "rounds": 0, "local_rewards": {Role.SOLVER: 1.0},
        "rewards_without_role": {Role.SOLVER: 0.0}, "circular_critique": False}


@pytest.mark.parametrize(("content", "grade", "kind"), [
    (r"\boxed{41}", WRONG, ErrorKind.WRONG_ANSWER),
    ("no box", MISSING, ErrorKind.MISSING_FINAL_ANSWER),
    (r"\boxed{)(}", Grade(False, ErrorKind.UNPARSEABLE_ANSWER, "worker"), ErrorKind.UNPARSEABLE_ANSWER),
])
def test_single_mode_keeps_the_error_site_markers(content: str, grade: Grade, kind: ErrorKind) -> None:
    ep = episode(EpisodeMode.SINGLE)
    turn = act(ep, "solver", content)
    metadata = payload(ep.last_observation)["metadata"]
    if kind is ErrorKind.MISSING_FINAL_ANSWER:  # the only one known at step time
        assert metadata["error_kind"] == kind.value and metadata["hint_template_key"] == f"solver/{kind.value}"
    rec = record(ep, {turn.answer: grade})
    assert rec.turns[0].error_kind is kind and rec.turns[0].hint_template_key == f"solver/{kind.value}"
    assert rec.episode_reward == 0.0 and rec.facts.local_rewards == {Role.SOLVER: 0.0}


def test_reset_observations_of_both_modes_come_from_their_own_templates() -> None:
    for mode in EpisodeMode:
        for episode_id in ("a", "quote\"back\\slash", "x" * 255):
            ep = DebateEpisode(episode_id, PROBLEM, 2, max_action_chars=10, mode=mode)
            assert ep.last_observation == ep._serialize(None)
            assert orjson.loads(ep.last_observation)["observation"]["mode"] == mode.value


def test_reset_request_takes_only_known_modes() -> None:
    assert ResetRequest.model_validate({"mode": "single"}).mode is EpisodeMode.SINGLE
    assert ResetRequest.model_validate({}).mode is None
    with pytest.raises(ValueError, match="debate"):
        ResetRequest.model_validate({"mode": "tournament"})


# --------------------------------------------------------------------------- circular critique


def test_a_resubmitted_rejected_answer_goes_to_the_judge_at_once() -> None:
    ep = episode()
    act(ep, "solver", r"\boxed{41}")
    act(ep, "verifier", "Wrong. VERDICT: INCORRECT")
    turn = act(ep, "solver", r"I still get $\boxed{ 41 }$.")  # same normal form
    metadata = payload(ep.last_observation)["metadata"]
    assert turn.circular and ep.role is Role.JUDGE and ep.round == 1  # two rounds left, no review
    assert metadata["circular_critique"] is True and metadata["error_kind"] == "repeated_rejected_answer"
    act(ep, "judge", r"\boxed{42}")
    rec = record(ep, {"41": WRONG, "42": RIGHT})
    assert [t.error_kind for t in rec.turns] == [ErrorKind.WRONG_ANSWER, None, ErrorKind.REPEATED_REJECTED_ANSWER, None]
    assert rec.facts.circular_critique and not rec.facts.verifier_accepted and rec.facts.rounds == 2
    assert rec.episode_reward == 1.0


def test_a_correct_answer_resubmitted_after_a_false_rejection_stops_without_blame() -> None:
    ep = episode()
    for role, content in [("solver", r"\boxed{\dfrac{84}{2}}"), ("verifier", "VERDICT: INCORRECT"),
                          ("solver", r"\boxed{\frac{84}{2}}"), ("judge", "no idea")]:
        act(ep, role, content)
    rec = record(ep, {r"\dfrac{84}{2}": RIGHT, r"\frac{84}{2}": RIGHT, None: MISSING})
    assert [t.error_kind for t in rec.turns] == [None, ErrorKind.FALSE_REJECT, None, ErrorKind.MISSING_FINAL_ANSWER]
    assert rec.facts.circular_critique and rec.episode_reward == 1.0  # the judge boxed none: the solver's last


def test_a_repeated_review_goes_to_the_judge_with_its_marker() -> None:
    ep = episode()
    act(ep, "solver", r"\boxed{41}")
    act(ep, "verifier", "Step 2 is wrong.\nVERDICT: INCORRECT")
    act(ep, "solver", r"\boxed{40}")
    turn = act(ep, "verifier", "  step 2 IS   wrong. verdict: incorrect ")
    metadata = payload(ep.last_observation)["metadata"]
    assert turn.circular and ep.role is Role.JUDGE
    assert metadata == {"episode_id": "e", "turn": 3, "role": "verifier", "error_kind": "circular_critique",
                        "hint_template_key": "verifier/circular_critique", "circular_critique": True,
                        "grading": "pending"}
    act(ep, "judge", r"\boxed{40}")
    rec = record(ep, {"41": WRONG, "40": WRONG})
    verifier = rec.turns[3]
    assert (verifier.reward, verifier.error_kind) == (1.0, ErrorKind.CIRCULAR_CRITIQUE)  # a right verdict, copied
    assert rec.facts.circular_critique and "verifier/circular_critique" in HINT_TEMPLATES


def test_graded_verifier_errors_take_precedence_over_a_repeated_review() -> None:
    ep = episode()
    for role, content in [("solver", r"\boxed{41}"), ("verifier", "VERDICT: INCORRECT"), ("solver", r"\boxed{42}"),
                          ("verifier", "verdict: incorrect"), ("judge", r"\boxed{42}")]:
        act(ep, role, content)
    rec = record(ep, {"41": WRONG, "42": RIGHT})
    assert rec.turns[3].error_kind is ErrorKind.FALSE_REJECT and rec.facts.circular_critique

    ep = episode()
    for role, content in [("solver", r"\boxed{41}"), ("verifier", "hmm"), ("solver", r"\boxed{40}"), ("verifier", "HMM")]:
        turn = act(ep, role, content)
    assert turn.circular and turn.provisional_kind is ErrorKind.MISSING_VERDICT and ep.role is Role.JUDGE


def test_a_new_answer_and_a_new_review_keep_the_debate_going() -> None:
    ep = episode()
    for role, content in [("solver", r"\boxed{41}"), ("verifier", "Step 2 is wrong. VERDICT: INCORRECT"),
                          ("solver", r"\boxed{40}"), ("verifier", "Step 3 is wrong. VERDICT: INCORRECT")]:
        turn = act(ep, role, content)
        assert not turn.circular and not payload(ep.last_observation)["metadata"]["circular_critique"]
    assert ep.role is Role.SOLVER and ep.round == 2


def test_merged_boxes_compare_by_their_normal_form() -> None:
    ep = episode()
    act(ep, "solver", r"\boxed{1} and \boxed{2}")
    act(ep, "verifier", "VERDICT: INCORRECT")
    turn = act(ep, "solver", r"$\boxed{1}$, $\boxed{2}$")
    assert turn.answer == "1, 2" and turn.circular and ep.role is Role.JUDGE


def test_with_the_stop_off_debates_run_as_before() -> None:
    ep = episode(circular_stop=False)
    for role, content in [("solver", r"\boxed{41}"), ("verifier", "VERDICT: INCORRECT"), ("solver", r"\boxed{41}"),
                          ("verifier", "VERDICT: INCORRECT")]:
        turn = act(ep, role, content)
        assert not turn.circular and not payload(ep.last_observation)["metadata"]["circular_critique"]
    assert ep.role is Role.SOLVER and ep.turns[2].provisional_kind is ErrorKind.REPEATED_REJECTED_ANSWER
    assert ep.turns[3].provisional_kind is None


# --------------------------------------------------------------------------- command line


def test_serve_and_play_options() -> None:
    parser = build_parser()
    config = _serve_config(parser.parse_args(["serve"]))
    assert config.mode is EpisodeMode.DEBATE and config.circular_critique_stop is True
    config = _serve_config(parser.parse_args(["serve", "--mode", "single", "--no-circular-critique-stop"]))
    assert config.mode is EpisodeMode.SINGLE and config.circular_critique_stop is False
    assert parser.parse_args(["play", "--mode", "single"]).mode == "single"
    assert parser.parse_args(["play"]).mode is None
    with pytest.raises(UsageError, match="invalid choice: 'tournament'"):  # one line, exit 2, through main
        parser.parse_args(["serve", "--mode", "tournament"])


# --------------------------------------------------------------------------- over a real socket


def test_single_mode_over_mux_with_typed_refusals(server_url) -> None:
    problem = GENERATOR.by_seed(21)

    async def main() -> None:
        async with MuxClient(server_url) as client:
            session, bystander = await client.open_session(), await client.open_session()
            await bystander.reset(problem_id=problem.problem_id)
            result = await session.reset(problem_id=problem.problem_id, mode=EpisodeMode.SINGLE, max_rounds=4)
            assert result.observation.mode is EpisodeMode.SINGLE and result.observation.max_rounds == 1
            result = await session.step("solver", rf"So the answer is $\boxed{{{problem.answer}}}$.")
            assert result.done and result.metadata["grading"] == "pending"
            rec = await session.rewards(timeout_s=60)
            assert rec is not None and [t.role for t in rec.turns] == [Role.SOLVER] and rec.episode_reward == 1.0
            assert rec.facts.verifier_accepted is None and rec.facts.judge_correct is None and rec.facts.rounds == 0
            assert rec.mode is EpisodeMode.SINGLE  # the record names its mode
            assert set(rec.facts.local_rewards) == set(rec.facts.rewards_without_role) == {Role.SOLVER}

            with pytest.raises(MuxError) as info:
                await session.reset(problem_id=problem.problem_id, mode="tournament")
            assert info.value.code == "VALIDATION_ERROR"
            assert info.value.data["errors"][0]["loc"][-1] == "mode"
            assert (await session.state())["episode_id"] == rec.episode_id  # nothing changed
            # the server keeps serving: the same session and its neighbour go on
            result = await session.reset(problem_id=problem.problem_id, mode="single")
            result = await session.step("solver", r"\boxed{-123456789}")
            rec = await session.rewards(timeout_s=60)
            assert rec is not None and rec.episode_reward == 0.0 and rec.turns[0].error_kind is ErrorKind.WRONG_ANSWER
            result = await bystander.step("solver", rf"\boxed{{{problem.answer}}}")
            assert result.observation.mode is EpisodeMode.DEBATE and result.observation.role is Role.VERIFIER
            await bystander.step("verifier", "VERDICT: CORRECT")
            await bystander.step("judge", rf"\boxed{{{problem.answer}}}")
            debate_record = await bystander.rewards(timeout_s=60)
            assert debate_record is not None and debate_record.mode is EpisodeMode.DEBATE
            # a record written before records named their mode (an old trajectory log or journal) reads as a debate
            older = debate_record.model_dump(mode="json")
            del older["mode"]
            assert EpisodeRewards.model_validate(older).mode is EpisodeMode.DEBATE

    asyncio.run(main())

    with SyncMuxClient(server_url) as client:
        session = client.open_session()
        assert session.reset(seed=3, mode="single").observation.mode is EpisodeMode.SINGLE
        assert session.reset(seed=3).observation.mode is EpisodeMode.DEBATE  # the server's default


def test_single_mode_over_openenv_ws_and_http(server_url) -> None:
    problem = GENERATOR.by_seed(22)

    async def ws_main() -> None:
        async with websockets.connect(server_url.replace("http", "ws") + "/ws") as ws:
            await ws.send(json.dumps({"type": "reset", "data": {"mode": "nope"}}))
            error = json.loads(await ws.recv())
            assert error["type"] == "error" and error["data"]["code"] == "VALIDATION_ERROR"
            assert error["data"]["errors"][0]["loc"] == ["mode"]
            await ws.send(json.dumps({"type": "reset", "data": {"mode": "single", "problem_id": problem.problem_id}}))
            assert json.loads(await ws.recv())["data"]["observation"]["mode"] == "single"
            await ws.send(json.dumps({"type": "step", "data": {"role": "solver", "content": rf"\boxed{{{problem.answer}}}"}}))
            final = json.loads(await ws.recv())["data"]
            assert final["done"] and final["reward"] == 1.0  # the terminal observation carries the reward

    asyncio.run(ws_main())

    with httpx.Client(base_url=server_url, timeout=30) as http:
        bad = http.post("/reset", json={"mode": "tournament"})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "mode"]
        first = http.post("/reset", json={"mode": "single", "problem_id": problem.problem_id}).json()
        assert first["observation"]["mode"] == "single"
        episode_id = first["observation"]["episode_id"]
        step = http.post("/step", json={"action": {"role": "solver", "content": r"\boxed{-1234567}"},
                                        "episode_id": episode_id})
        assert step.status_code == 200 and step.json()["done"] and step.json()["reward"] == 0.0
        state = http.get("/state", params={"episode_id": episode_id}).json()
        assert state["mode"] == "single" and state["graded"] is True


def test_circular_critique_over_a_real_socket(server_url) -> None:
    problem = GENERATOR.by_seed(23)

    async def main() -> None:
        async with MuxClient(server_url) as client:
            session = await client.open_session()
            await session.reset(problem_id=problem.problem_id, max_rounds=3)
            await session.step("solver", r"\boxed{-4444}")
            await session.step("verifier", "Recompute. VERDICT: INCORRECT")
            result = await session.step("solver", r"Again, $\boxed{-4444}$.")
            assert result.observation.role is Role.JUDGE and result.metadata["circular_critique"] is True
            assert result.metadata["error_kind"] == "repeated_rejected_answer"
            await session.step("judge", rf"\boxed{{{problem.answer}}}")
            rec = await session.rewards(timeout_s=60)
            assert rec is not None and rec.facts.circular_critique and rec.episode_reward == 1.0
            assert [t.role for t in rec.turns] == [Role.SOLVER, Role.VERIFIER, Role.SOLVER, Role.JUDGE]

            await session.reset(problem_id=problem.problem_id, max_rounds=3)
            await session.step("solver", r"\boxed{-4444}")
            await session.step("verifier", "Recompute.\nVERDICT: INCORRECT")
            await session.step("solver", r"\boxed{-4445}")
            result = await session.step("verifier", "RECOMPUTE. VERDICT: INCORRECT")
            assert result.observation.role is Role.JUDGE and result.metadata["error_kind"] == "circular_critique"
            await session.step("judge", r"\boxed{-4445}")
            rec = await session.rewards(timeout_s=60)
            assert rec is not None and rec.turns[3].error_kind is ErrorKind.CIRCULAR_CRITIQUE
            assert rec.facts.circular_critique and rec.episode_reward == 0.0

    asyncio.run(main())


def test_multi_box_answers_are_graded_as_collections_by_the_server(server_url) -> None:
    roots = GENERATOR.get("gen/quadratic_roots/0")  # \{1, 8\}
    single = GENERATOR.by_seed(24)

    async def main() -> None:
        async with MuxClient(server_url) as client:
            session = await client.open_session()
            for content, answer, correct in [(r"The roots are $\boxed{8}$ and $\boxed{1}$.", "8, 1", True),
                                             (r"\boxed{8}, \boxed{2}", "8, 2", False)]:
                await session.reset(problem_id=roots.problem_id, mode="single")
                await session.step("solver", content)
                rec = await session.rewards(timeout_s=60)
                assert rec is not None and (rec.turns[0].answer, rec.turns[0].correct) == (answer, correct)
            await session.reset(problem_id=single.problem_id, mode="single")
            await session.step("solver", rf"\boxed{{-98765}} or \boxed{{{single.answer}}}")
            rec = await session.rewards(timeout_s=60)
            assert rec is not None and rec.episode_reward == 0.0  # hedging between answers is not an answer

    asyncio.run(main())


def test_play_in_single_mode(server_url) -> None:
    report = asyncio.run(play(server_url, GENERATOR, episodes=6, concurrency=3, policy="reference", seed=5,
                              progress=False, mode="single"))
    assert report.episodes == 6 and report.failed == 0 and report.accuracy == 1.0
    assert report.summary()["reward/verifier"] is None and report.summary()["judge_accuracy"] is None
    assert report.steps == 6  # one solver turn per episode


def test_server_wide_mode_and_stop_switch() -> None:
    problem = GENERATOR.by_seed(25)

    async def main(url: str) -> None:
        async with MuxClient(url) as client:
            session = await client.open_session()
            assert (await session.reset(problem_id=problem.problem_id)).observation.mode is EpisodeMode.SINGLE
            await session.reset(problem_id=problem.problem_id, mode="debate")
            roles = []
            for role, content in [("solver", r"\boxed{-4444}"), ("verifier", "VERDICT: INCORRECT"),
                                  ("solver", r"\boxed{-4444}")]:
                result = await session.step(role, content)
                roles.append(result.observation.role)
                assert result.metadata["circular_critique"] is False
            assert roles == [Role.VERIFIER, Role.SOLVER, Role.VERIFIER]  # the stop is off: reviewed again

    with running_server(["--mode", "single", "--no-circular-critique-stop", "--grading-workers", "1"]) as url:
        asyncio.run(main(url))
