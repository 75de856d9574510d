"""Fuzzing with hypothesis: arbitrary and mutated frames on /ws and /ws/mux, arbitrary HTTP bodies.

Invariants: never a crash, a 5xx or a dropped socket; every bad frame gets a typed error frame
(a documented code); other sessions (on another connection and on the same one) keep going and
complete correctly afterwards.
"""

from __future__ import annotations

import json

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_helpers import ERROR_CODES, PROBLEMS, RawMux, open_ws, play_reference_episode

SETTINGS = settings(max_examples=150, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
MUX_TYPES = ["open", "attach", "reset", "step", "state", "rewards", "close", "ping", "teleport", "", None, 7]
#: frames that are not even frames: bytes, text, any JSON value
garbage = st.one_of(st.binary(max_size=200), st.text(max_size=200), json_values.map(json.dumps))


@st.composite
def mutated_mux_frame_dicts(draw) -> dict:
    frame = {"type": draw(st.sampled_from(MUX_TYPES)),
             "request_id": draw(st.one_of(st.text(max_size=8), st.integers(), json_values))}
    if draw(st.booleans()):
        frame["session_id"] = draw(st.one_of(st.text(max_size=12), json_values))
    if draw(st.booleans()):
        frame["data"] = draw(st.one_of(
            json_values,
            st.fixed_dictionaries({"role": st.sampled_from(["solver", "verifier", "judge", "x", 3]),
                                   "content": st.one_of(st.text(max_size=50), json_values)}),
            st.fixed_dictionaries({"t": st.one_of(st.integers(), json_values), "seed": st.integers()}),
        ))
    return frame


#: one mutated frame, or a batch of them (RFC 0005), as sent
mutated_mux_frames = st.one_of(
    mutated_mux_frame_dicts().map(json.dumps),
    st.lists(mutated_mux_frame_dicts(), min_size=1, max_size=5).map(json.dumps),
)


def expected_replies(raw: str | bytes) -> int:
    """How many replies a message gets (RFC 0005): one per frame of a batch, else one.
    JSON is read as the server reads it (orjson: e.g. integers past 64 bits are invalid)."""
    try:
        message = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return 1
    return len(message) if isinstance(message, list) and message else 1


@pytest.fixture(scope="module")
def witness_session(server_url):
    """A session on its own connection, mid-episode while the fuzzing runs."""
    mux = RawMux(server_url)
    session_id = mux.request("open")["session_id"]
    yield mux, session_id
    mux.close()


def test_mux_frames_always_get_typed_replies_and_nothing_else_breaks(server_url, witness_session) -> None:
    fuzz = RawMux(server_url)
    own_session = fuzz.request("open")["session_id"]  # a session on the fuzzed connection itself
    witness, witness_id = witness_session
    problem = PROBLEMS.by_seed(11)
    assert witness.request("reset", witness_id, {"problem_id": problem.problem_id})["type"] == "observation"

    @SETTINGS
    @given(garbage | mutated_mux_frames)
    def check(raw) -> None:
        fuzz.send_raw(raw)
        for _ in range(expected_replies(raw)):
            reply = fuzz.next_reply()
            if reply["type"] == "error":
                assert reply["data"]["code"] in ERROR_CODES, reply
            else:  # a mutation that happened to be valid (ping, open, ...)
                assert reply["type"] in {"pong", "opened", "observation", "state", "replay", "rewards", "closed",
                                         "attached"}, reply

    check()
    # the fuzzed connection, its earlier session and the witness all still work
    assert fuzz.request("ping")["type"] == "pong"
    assert play_reference_episode(fuzz, 12, own_session)["episode_reward"] == 1.0
    text = f"so \\boxed{{{problem.answer}}}"
    for role, content in (("solver", text), ("verifier", "VERDICT: CORRECT"), ("judge", text)):
        assert witness.request("step", witness_id, {"role": role, "content": content})["type"] == "observation"
    record = witness.request("rewards", witness_id, {"wait": True, "timeout_s": 30})["data"]["record"]
    assert record["episode_reward"] == 1.0
    fuzz.close()


@st.composite
def mutated_openenv_frames(draw) -> str:
    # never "close": that one legitimately ends the connection (OpenEnv)
    frame = {"type": draw(st.sampled_from(["reset", "step", "state", "mcp", "teleport", "", None, 3]))}
    if draw(st.booleans()):
        frame["data"] = draw(st.one_of(json_values, st.fixed_dictionaries(
            {"role": st.sampled_from(["solver", "judge", "x", None]), "content": st.one_of(st.text(max_size=30), json_values)})))
    return json.dumps(frame)


def test_openenv_ws_frames_always_get_typed_replies(server_url) -> None:
    ws = open_ws(server_url, "/ws")

    @SETTINGS
    @given(garbage | mutated_openenv_frames())
    def check(raw) -> None:
        ws.send(raw)
        reply = json.loads(ws.recv(timeout=15))
        if reply["type"] == "error":
            assert reply["data"]["code"] in ERROR_CODES, reply
        else:
            assert reply["type"] in {"observation", "state", "mcp"}, reply

    check()
    # the connection still plays a whole episode correctly
    problem = PROBLEMS.by_seed(5)
    ws.send(json.dumps({"type": "reset", "data": {"problem_id": problem.problem_id}}))
    assert json.loads(ws.recv(timeout=15))["type"] == "observation"
    text = f"\\boxed{{{problem.answer}}}"
    for role, content in (("solver", text), ("verifier", "VERDICT: CORRECT"), ("judge", text)):
        ws.send(json.dumps({"type": "step", "data": {"role": role, "content": content}}))
        reply = json.loads(ws.recv(timeout=30))
    assert reply["data"]["done"] and reply["data"]["reward"] == 1.0
    ws.close()


@pytest.mark.parametrize("route", ["/reset", "/step", "/mcp"])
def test_http_bodies_never_give_a_server_error(server_url, route: str) -> None:
    with httpx.Client(base_url=server_url, timeout=30) as http:
        @SETTINGS
        @given(st.one_of(json_values.map(json.dumps), st.binary(max_size=100), st.text(max_size=100)))
        def check(body) -> None:
            response = http.post(route, content=body, headers={"content-type": "application/json"})
            assert response.status_code < 500, (body, response.status_code, response.text[:200])
            if response.status_code >= 400:
                assert isinstance(response.json(), dict)  # a JSON error body, not a bare page

        check()
        assert http.get("/health").status_code == 200
