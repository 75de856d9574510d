"""/ws/mux against a real server on a real socket: multiplexing, out-of-order replies, drop and
re-attach, isolation, state(t) byte identity, errors that leave other sessions working."""

from __future__ import annotations

import asyncio
import json

import orjson
import pytest
import websockets

from env_server.client import MuxClient, MuxError
from env_server.debate.problems import ProblemGenerator
from env_server.protocol.markers import Role
from env_server.protocol.models import EpisodeRewards

GENERATOR = ProblemGenerator()


def run(coro):
    return asyncio.run(coro)


async def play_correct(session, seed: int) -> str:
    """Play one debate where everyone is right; returns the episode id."""
    problem = GENERATOR.by_seed(seed)
    result = await session.reset(problem_id=problem.problem_id)
    assert result.observation.role is Role.SOLVER
    await session.step("solver", problem.solution)
    await session.step("verifier", "Checked.\nVERDICT: CORRECT")
    result = await session.step("judge", rf"Final: \boxed{{{problem.answer}}}")
    assert result.done and result.reward is None  # rewards are delayed on /ws/mux
    return result.observation.episode_id


def test_hundred_sessions_on_one_connection_with_out_of_order_replies(server_url) -> None:
    async def main() -> None:
        async with MuxClient(server_url) as client:
            sessions = [await client.open_session() for _ in range(100)]
            # start one debate per session, all interleaved on the one connection
            episode_ids = await asyncio.gather(*(play_correct(s, seed) for seed, s in enumerate(sessions)))
            assert len(set(episode_ids)) == 100

            # A rewards request with wait=true on a fresh, unfinished episode answers only when
            # its grading ends; a ping sent after it is answered first: replies out of order.
            laggard = sessions[0]
            problem = GENERATOR.by_seed(1000)
            await laggard.reset(problem_id=problem.problem_id)
            waiting = asyncio.create_task(laggard.rewards(wait=True, timeout_s=30))
            await asyncio.sleep(0.05)
            await client.ping()
            assert not waiting.done()
            await laggard.step("solver", problem.solution)
            await laggard.step("verifier", "VERDICT: CORRECT")
            await laggard.step("judge", rf"\boxed{{{problem.answer}}}")
            record = await waiting
            assert record is not None and record.episode_reward == 1.0

            records = await asyncio.gather(*(s.rewards(episode_id=e) for s, e in zip(sessions, episode_ids, strict=True)))
            assert all(isinstance(r, EpisodeRewards) and r.episode_reward == 1.0 for r in records)
            assert {r.session_id for r in records} == {s.session_id for s in sessions}

    run(main())


def test_raw_out_of_order_replies_keep_their_request_ids(server_url) -> None:
    """At the frame level: request 1 (rewards, wait) is answered after request 2 (ping)."""

    async def main() -> None:
        async with websockets.connect(server_url.replace("http", "ws") + "/ws/mux") as ws:
            await ws.send(json.dumps({"type": "open", "request_id": "o"}))
            opened = json.loads(await ws.recv())
            sid = opened["session_id"]
            await ws.send(json.dumps({"type": "reset", "request_id": "r", "session_id": sid, "data": {"seed": 5}}))
            await ws.recv()
            await ws.send(json.dumps({"type": "rewards", "request_id": 1, "session_id": sid,
                                      "data": {"wait": True, "timeout_s": 1}}))
            await ws.send(json.dumps({"type": "ping", "request_id": 2}))
            first, second = json.loads(await ws.recv()), json.loads(await ws.recv())
            assert (first["type"], first["request_id"]) == ("pong", 2)
            assert (second["type"], second["request_id"], second["data"]["status"]) == ("rewards", 1, "pending")

    run(main())


def test_drop_and_reattach_delivers_rewards_graded_meanwhile(server_url) -> None:
    async def main() -> None:
        client = await MuxClient(server_url).connect()
        session = await client.open_session()
        problem = GENERATOR.by_seed(7)
        await session.reset(problem_id=problem.problem_id)
        await session.step("solver", rf"I am not sure: \boxed{{{problem.answer}}}")
        await session.step("verifier", "VERDICT: CORRECT")
        # the connection drops right after the last action, before the record is pushed
        await client._ws.send(orjson.dumps({"type": "step", "request_id": 999, "session_id": session.session_id,
                                            "data": {"role": "judge", "content": rf"\boxed{{{problem.answer}}}"}}).decode())
        await client.drop()
        await asyncio.sleep(1.0)  # graded while nobody is attached
        await client.reconnect()
        record = await asyncio.wait_for(_until_record(session), 10)
        assert record.episode_id == session.episode_id and record.episode_reward == 1.0
        # the session itself is intact after re-attachment
        state = await session.state()
        assert state["done"] and state["graded"] and state["episode_reward"] == 1.0
        await client.close()

    async def _until_record(session):
        while not session._records:  # pushed on attach, no request needed
            await asyncio.sleep(0.02)
        return next(iter(session._records.values()))

    run(main())


def test_other_connection_cannot_touch_a_session_without_its_token(server_url) -> None:
    async def main() -> None:
        async with MuxClient(server_url) as owner, MuxClient(server_url) as intruder:
            session = await owner.open_session()
            await session.reset(seed=1)
            for frame in ({"type": "step", "session_id": session.session_id, "data": {"role": "solver", "content": "x"}},
                          {"type": "state", "session_id": session.session_id, "data": {}}):
                with pytest.raises(MuxError) as info:
                    await intruder.request(frame)
                assert info.value.code == "UNKNOWN_SESSION"
            with pytest.raises(MuxError) as info:
                await intruder.attach(session.session_id, "not-the-token")
            assert info.value.code == "RESUME_DENIED"
            # the owner is unaffected
            assert (await session.state())["step_count"] == 0
            # with the token, the intruder takes the session over and the owner loses it
            await intruder.attach(session.session_id, session.resume_token)
            with pytest.raises(MuxError):
                await session.state()

    run(main())


def test_state_t_replays_the_exact_bytes_sent(server_url) -> None:
    async def main() -> None:
        async with MuxClient(server_url) as client:
            session = await client.open_session()
            problem = GENERATOR.by_seed(11)
            sent = [(await session.reset(problem_id=problem.problem_id)).raw]
            sent.append((await session.step("solver", r"first try \boxed{0}")).raw)
            sent.append((await session.step("verifier", "VERDICT: INCORRECT, recheck")).raw)
            sent.append((await session.step("solver", problem.solution)).raw)
            for t, raw in enumerate(sent):
                replay = await session.state(t=t)
                assert replay["observation_raw"] == raw
                assert replay["observation"]["observation"]["t"] == t
            with pytest.raises(MuxError) as info:
                await session.state(t=len(sent))
            assert info.value.code == "OUT_OF_RANGE"
            with pytest.raises(MuxError) as info:
                await session.state(t=-1)
            assert info.value.code == "OUT_OF_RANGE"

    run(main())


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("{not json", "INVALID_JSON"),
        (json.dumps({"type": "teleport", "request_id": 1}), "UNKNOWN_TYPE"),
        (json.dumps({"type": "step", "request_id": 1}), "VALIDATION_ERROR"),
        (json.dumps(5), "VALIDATION_ERROR"),
        (json.dumps([]), "VALIDATION_ERROR"),  # an empty batch (RFC 0005)
        ("x" * ((1 << 20) + 1), "FRAME_TOO_LARGE"),
    ],
)
def test_malformed_frames_get_error_frames_and_others_keep_working(server_url, raw: str, code: str) -> None:
    async def main() -> None:
        async with MuxClient(server_url) as client:
            bystander = await client.open_session()
            problem = GENERATOR.by_seed(3)
            await bystander.reset(problem_id=problem.problem_id)
            async with websockets.connect(server_url.replace("http", "ws") + "/ws/mux", max_size=None) as ws:
                await ws.send(raw)
                reply = json.loads(await ws.recv())
                assert reply["type"] == "error" and reply["data"]["code"] == code
                await ws.send(json.dumps({"type": "ping", "request_id": "after"}))
                assert json.loads(await ws.recv())["type"] == "pong"  # same connection still served
            await bystander.step("solver", problem.solution)
            await bystander.step("verifier", "VERDICT: CORRECT")
            await bystander.step("judge", rf"\boxed{{{problem.answer}}}")
            assert (await bystander.rewards()).episode_reward == 1.0

    run(main())


@pytest.mark.parametrize(
    ("role", "content", "kind"),
    [("verifier", "VERDICT: CORRECT", "role_mismatch"), ("solver", "   ", "empty_response"),
     ("solver", "y" * 40_000, "too_long")],
)
def test_invalid_actions_are_typed_errors_and_the_episode_continues(server_url, role, content, kind) -> None:
    async def main() -> None:
        async with MuxClient(server_url) as client:
            session = await client.open_session()
            problem = GENERATOR.by_seed(21)
            await session.reset(problem_id=problem.problem_id)
            with pytest.raises(MuxError) as info:
                await session.step(role, content)
            assert info.value.code == "INVALID_ACTION"
            assert info.value.data["error_kind"] == kind
            assert info.value.data["hint_template_key"] == f"solver/{kind}"
            result = await session.step("solver", problem.solution)  # nothing was consumed
            assert result.observation.t == 1

    run(main())


@pytest.mark.parametrize(("how", "expected_code"), [("drop", 1006), ("close", 1000)])
def test_drop_aborts_the_transport_without_a_close_frame(how: str, expected_code: int) -> None:
    """``drop`` must look like a crash to the server (no close frame: 1006), unlike ``close`` (1000)."""
    seen: asyncio.Queue[int | None] = asyncio.Queue()

    async def handler(ws) -> None:
        try:
            async for _ in ws:
                pass
        except websockets.ConnectionClosed:
            pass
        seen.put_nowait(ws.close_code)

    async def main() -> None:
        async with websockets.serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            client = await MuxClient(f"http://127.0.0.1:{port}").connect()
            await getattr(client, how)()
            assert await asyncio.wait_for(seen.get(), 10) == expected_code

    run(main())


def test_a_re_sent_step_with_its_t_is_answered_from_the_store_and_not_taken_twice(server_url):
    """RFC 0004 "Re-sent steps": a client that lost a step's reply re-sends it with the turn's
    ``t`` and gets the same bytes, without a second turn; a wrong ``t`` or another action for a
    taken turn is OUT_OF_RANGE; over HTTP the same holds."""
    import httpx

    async def main() -> None:
        async with MuxClient(server_url) as client:
            session = await client.open_session()
            problem = GENERATOR.by_seed(21)
            await session.reset(problem_id=problem.problem_id, max_rounds=1)
            first = await session.step("solver", problem.solution, t=0)
            again = await session.step("solver", problem.solution, t=0)
            assert again.raw == first.raw and again.observation.role is Role.VERIFIER
            assert (await session.state())["step_count"] == 1
            for role, content, t in (("solver", "another answer \\boxed{1}", 0), ("verifier", "VERDICT: CORRECT", 5)):
                with pytest.raises(MuxError) as error:
                    await session.step(role, content, t=t)
                assert error.value.code == "OUT_OF_RANGE" and error.value.data["next_t"] == 1
            await session.step("verifier", "Fine.\nVERDICT: CORRECT", t=1)
            last = await session.step("judge", f"\\boxed{{{problem.answer}}}")  # no t: as before
            assert last.done
            resent = await session.step("judge", f"\\boxed{{{problem.answer}}}", t=2)  # the terminal turn again
            assert resent.done and resent.raw == last.raw
            record = await session.rewards(wait=True, timeout_s=30)
            assert record is not None and [turn.t for turn in record.turns] == [0, 1, 2]

    run(main())
    problem = GENERATOR.by_seed(22)
    with httpx.Client(base_url=server_url, timeout=30) as http:
        episode_id = http.post("/reset", json={"problem_id": problem.problem_id}).json()["observation"]["episode_id"]
        action = {"role": "solver", "content": problem.solution, "t": 0}
        first = http.post("/step", json={"episode_id": episode_id, "action": action}).json()
        again = http.post("/step", json={"episode_id": episode_id, "action": action}).json()
        assert again == first and http.get("/state", params={"episode_id": episode_id}).json()["step_count"] == 1


def test_a_re_sent_open_gets_the_session_the_first_one_opened(server_url) -> None:
    """RFC 0001 "Re-sent opens": the reply to an ``open`` is lost with its connection; the client
    re-sends it (same ``open_id``) on a new connection and gets the same session and token, now
    attached there, instead of a second session while the first waits out its resume window."""

    async def main() -> None:
        url = server_url.replace("http", "ws") + "/ws/mux"
        open_id = "a" * 32
        async with websockets.connect(url) as first:
            await first.send(json.dumps({"type": "open", "request_id": 1, "data": {"open_id": open_id}}))
            opened = json.loads(await first.recv())
        # the first connection is gone (its reply "lost"); the open is re-sent elsewhere
        async with websockets.connect(url) as second:
            await second.send(json.dumps({"type": "open", "request_id": 1, "data": {"open_id": open_id}}))
            again = json.loads(await second.recv())
            assert again["type"] == "opened"
            assert (again["session_id"], again["data"]["resume_token"]) == (opened["session_id"],
                                                                           opened["data"]["resume_token"])
            # it is attached to the new connection
            await second.send(json.dumps({"type": "reset", "request_id": 2, "session_id": again["session_id"],
                                          "data": {"seed": 3}}))
            assert json.loads(await second.recv())["type"] == "observation"
            # another nonce, or none, opens another session
            for data in ({"open_id": "b" * 32}, {}):
                await second.send(json.dumps({"type": "open", "request_id": 3, "data": data}))
                other = json.loads(await second.recv())
                assert other["type"] == "opened" and other["session_id"] != opened["session_id"]
            # a nonce too short to be one is refused with an error frame; the connection serves on
            await second.send(json.dumps({"type": "open", "request_id": 4, "data": {"open_id": "short"}}))
            refused = json.loads(await second.recv())
            assert (refused["type"], refused["request_id"]) == ("error", 4)
            await second.send(json.dumps({"type": "ping", "request_id": 5}))
            assert json.loads(await second.recv())["type"] == "pong"

    run(main())


def test_session_registry_answers_a_re_sent_open_without_a_second_session() -> None:
    from env_server.service.sessions import SessionRegistry

    class Conn:
        def __init__(self, name: str) -> None:
            self.connection_id, self.session_ids = name, set()

        def rewards_ready(self, session_id, body) -> None: ...

        def session_closed(self, session_id, reason) -> None: ...

    registry = SessionRegistry(max_sessions=10, max_per_connection=10, resume_window_s=5, idle_timeout_s=60)
    old, new = Conn("old"), Conn("new")
    session, token, earlier = registry.open("mux", old, "n" * 16)
    assert not earlier and len(registry) == 1
    registry.detach(old)
    again, token_again, earlier = registry.open("mux", new, "n" * 16)
    assert earlier and again is session and token_again == token and len(registry) == 1
    assert session.owner is new and session.detached_at is None and new.session_ids == {session.session_id}
    # past the resume window of the first open the nonce is forgotten (the reaper prunes it)
    registry.expired(now=__import__("time").monotonic() + 6)
    _, _, earlier = registry.open("mux", new, "n" * 16)
    assert not earlier
