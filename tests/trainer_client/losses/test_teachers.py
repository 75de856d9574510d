"""Teacher pool, disagreement scoring and the pair store (real HTTP server, real grader)."""

from __future__ import annotations

import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from env_server.debate.problems import ProblemGenerator
from env_server.protocol.markers import Role
from trainer_client.losses.pair_store import DpoPair, PairStore
from trainer_client.losses.teachers import (
    AnswerEquivalence,
    OpenAITeacher,
    ReplayRequest,
    Teacher,
    TeacherConfig,
    TeacherPool,
    TeacherReply,
    build_teacher,
    score_disagreement,
)

GENERATOR = ProblemGenerator()


def same(a: str, b: str) -> bool:
    return a == b


@pytest.mark.parametrize(
    ("student", "teachers", "expected"),
    [
        ("41", ["42", "42", "7"], 0),  # two agree on 42, the student differs: teacher 0 is chosen
        ("42", ["42", "42", "7"], None),  # the student agrees with the majority
        ("41", ["1", "2", "3"], None),  # all teachers disagree
        ("41", ["7", "42", "42", "42", "7"], 1),  # the largest cluster wins
        ("41", ["7", "7", "42", "42"], 0),  # a tie: the first cluster formed
        (None, ["42", None, "42"], 0),  # no student answer; None teachers agree with nothing
        ("41", [None, None], None),
    ],
)
def test_score_disagreement(student, teachers, expected) -> None:
    assert score_disagreement(student, teachers, same) == expected


def test_equivalence_uses_the_env_grader() -> None:
    equivalent = AnswerEquivalence()
    try:
        assert equivalent(r"\frac12", "0.5") and equivalent(r"\frac{1}{2}", r"\frac{2}{4}")
        assert not equivalent(r"\frac12", r"\frac13")
        assert score_disagreement("0.5", [r"\frac12", "0.50", "3"], equivalent) is None  # student agrees
        assert score_disagreement("3", [r"\frac12", "0.50", "3"], equivalent) == 0
        assert equivalent("CORRECT", "CORRECT") and not equivalent("CORRECT", "INCORRECT")
    finally:
        equivalent.close()


class FakeOpenAI(BaseHTTPRequestHandler):
    """A local stand-in for /v1/chat/completions; behaviour is picked by the model name."""

    calls: ClassVar[list[dict]] = []
    failures_left: ClassVar[dict[str, int]] = {"flaky": 1}

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeOpenAI.calls.append({"auth": self.headers.get("Authorization"), **body})
        model = body["model"]
        if model == "hang":
            time.sleep(3)
        if model == "flaky" and FakeOpenAI.failures_left["flaky"] > 0:
            FakeOpenAI.failures_left["flaky"] -= 1
            self.send_response(500)
            self.end_headers()
            return
        if model == "bad-request":
            self.send_response(400)
            self.end_headers()
            self.wfile.write(b'{"error": "no"}')
            return
        answer = {"right": r"The answer is \boxed{42}.", "flaky": r"So \boxed{42}", "wrong": r"\boxed{7}"}.get(model, "?")
        payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": answer}}],
                              "usage": {"prompt_tokens": 10, "completion_tokens": 5}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def fake_openai():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def openai(base_url: str, model: str, **kwargs) -> OpenAITeacher:
    return OpenAITeacher(TeacherConfig(name=model, kind="openai", base_url=base_url, model=model, **kwargs))


def test_openai_teacher_success_retry_timeout_and_key(fake_openai, monkeypatch) -> None:
    monkeypatch.setenv("TEACHER_KEY", "sk-test")
    reply = openai(fake_openai, "right", api_key_env="TEACHER_KEY").respond([{"role": "user", "content": "q"}], "p")
    assert reply.text == r"The answer is \boxed{42}." and (reply.prompt_tokens, reply.completion_tokens) == (10, 5)
    assert FakeOpenAI.calls[-1]["auth"] == "Bearer sk-test" and FakeOpenAI.calls[-1]["messages"][0]["content"] == "q"
    assert openai(fake_openai, "flaky", max_retries=2).respond([], "p").text == r"So \boxed{42}"  # 500, then 200
    with pytest.raises(TimeoutError):
        openai(fake_openai, "hang", timeout_s=0.5, max_retries=0).respond([], "p")
    with pytest.raises(RuntimeError, match="HTTP 400: no"):  # the server's message
        openai(fake_openai, "bad-request", max_retries=3).respond([], "p")
    monkeypatch.delenv("TEACHER_KEY")
    with pytest.raises(RuntimeError, match="TEACHER_KEY"):
        openai(fake_openai, "right", api_key_env="TEACHER_KEY")


def replay(seed: int, student: str, **tokens) -> ReplayRequest:
    problem = GENERATOR.by_seed(seed)
    return ReplayRequest(episode_id=f"e{seed}", t=0, role=Role.SOLVER, problem_id=problem.problem_id,
                         messages=[{"role": "user", "content": problem.problem}],
                         student_response=rf"\boxed{{{student}}}", student_answer=student, **tokens)


def test_pool_emits_pairs_in_the_background_within_budget(fake_openai) -> None:
    oracle = TeacherConfig(name="oracle", kind="oracle")
    oracles = [build_teacher(oracle, GENERATOR), build_teacher(oracle.model_copy(update={"name": "oracle-2"}), GENERATOR)]
    wrong = replay(1, "-123456", context_ids=(5, 6, 7), rejected_ids=(8, 9))
    right = replay(2, GENERATOR.by_seed(2).answer)
    # a third teacher that never answers in time: its calls fail, so no replay gives a pair (a
    # failed request is not an answer: the vote was not taken among all the teachers)
    pool = TeacherPool([*oracles, openai(fake_openai, "hang", timeout_s=0.5, max_retries=0)], budget_per_step=6,
                       max_workers=4)  # 2 requests x 3 teachers
    try:
        start = time.monotonic()
        pool.submit_step(0, [wrong, right, replay(3, "0")])
        assert time.monotonic() - start < 0.2  # never blocks the training loop
        pool.wait(timeout_s=60)
        assert pool.collect() == []
        counters = pool.counters()
        assert counters["teachers/dropped"] == 1 and counters["teachers/timeouts"] == 2
        assert counters["teachers/replays"] == counters["teachers/failed_replays"] == 2
        assert counters.get("pairs/emitted", 0) == 0
        assert (pool.failures.requests, pool.failures.failed) == (2, 2)  # the endpoint teacher's requests
        assert pool.failures.examples == {"timeout": "no reply within 0.5 s"}
    finally:
        pool.close()
    pool = TeacherPool(oracles, budget_per_step=4, max_workers=4)
    try:
        pool.submit_step(0, [wrong, right])
        pool.wait(timeout_s=60)
        pairs = pool.collect()
        assert [(p.episode_id, p.teacher) for p in pairs] == [("e1", "oracle")]
        assert pairs[0].chosen == GENERATOR.by_seed(1).solution and pairs[0].rejected == r"\boxed{-123456}"
        # the rollout's tokens travel with the pair (the trainer adds the chosen side's ids)
        assert (pairs[0].context_ids, pairs[0].rejected_ids, pairs[0].chosen_ids) == ([5, 6, 7], [8, 9], None)
        assert pairs[0].gold_supervised  # oracles agreed on it: the reference solution is the target
        counters = pool.counters()
        assert counters["teachers/replays"] == 2 and counters["pairs/emitted"] == 1
        assert counters["pairs/gold_supervised"] == 1 and "teachers/failed_replays" not in counters
        assert pool.collect() == []
    finally:
        pool.close()


def test_cost_counter(fake_openai) -> None:
    teachers = [openai(fake_openai, "right", cost_per_1k_tokens=2.0), openai(fake_openai, "right", cost_per_1k_tokens=2.0)]
    pool = TeacherPool(teachers, equivalent=lambda a, b: a == b, budget_per_step=10)
    try:
        pool.submit_step(3, [replay(4, "7")])
        pool.wait()
        pairs = pool.collect()
        assert [p.created_step for p in pairs] == [3]
        assert not pairs[0].gold_supervised and pairs[0].context_ids is None  # no oracle; a request without tokens
        assert pool.counters()["teachers/calls"] == 2 and pool.counters()["teachers/cost_usd"] == pytest.approx(0.06)
    finally:
        pool.close()


class SlowTeacher(Teacher):
    """Answers after ``delay_s`` and records how many of its kind were answering at once."""

    active: ClassVar[int] = 0
    peak: ClassVar[int] = 0
    lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, name: str, delay_s: float = 0.5) -> None:
        super().__init__(TeacherConfig(name=name, kind="hf", model="unused"))
        self.delay_s = delay_s

    def respond(self, messages, problem_id) -> TeacherReply:
        with SlowTeacher.lock:
            SlowTeacher.active += 1
            SlowTeacher.peak = max(SlowTeacher.peak, SlowTeacher.active)
        time.sleep(self.delay_s)
        with SlowTeacher.lock:
            SlowTeacher.active -= 1
        return TeacherReply(r"\boxed{42}")


def timed_replay(max_workers: int) -> tuple[float, int, int]:
    """Seconds for one request to two slow teachers, the most answering at once, pairs made."""
    SlowTeacher.peak = 0
    pool = TeacherPool([SlowTeacher("slow-a"), SlowTeacher("slow-b")], equivalent=same, budget_per_step=2,
                       max_workers=max_workers)
    try:
        start = time.monotonic()
        pool.submit_step(0, [replay(5, "7")])
        pool.wait(timeout_s=30)
        elapsed = time.monotonic() - start
        return elapsed, SlowTeacher.peak, len(pool.collect())
    finally:
        pool.close()


def test_a_requests_teachers_answer_in_parallel_within_max_workers() -> None:
    elapsed, peak, pairs = timed_replay(max_workers=2)
    assert peak == 2 and pairs == 1
    assert elapsed < 0.9, f"two 0.5 s teachers took {elapsed:.2f}s: they were not asked in parallel"
    elapsed, peak, pairs = timed_replay(max_workers=1)  # the pool's bound holds: one call at a time
    assert peak == 1 and pairs == 1 and elapsed >= 1.0


def test_pair_store_round_trip_and_truncated_line(tmp_path) -> None:
    path = tmp_path / "pairs.jsonl"
    store = PairStore(path)
    pairs = [DpoPair(prompt_messages=[{"role": "user", "content": f"q{i}"}], chosen="c", rejected="r", episode_id=f"e{i}",
                     t=0, role="solver", teacher="oracle", created_step=i, context_ids=[1, 2, i], chosen_ids=[3],
                     rejected_ids=[4, 5], gold_supervised=True, ref_chosen_logp=-1.0, ref_rejected_logp=-2.0)
             for i in range(3)]
    store.add(pairs)
    store.add([pairs[0].model_copy(update={"ref_chosen_logp": None, "episode_id": "pending"})])
    with path.open("a") as handle:
        handle.write('{"prompt_messages": [{"role": "us')  # a crash mid-write
    reloaded = PairStore(path)
    assert len(reloaded) == 4
    sample = reloaded.sample(10, random.Random(0))
    assert sorted(p.episode_id for p in sample) == ["e0", "e1", "e2"]  # only pairs with reference log-probs
    assert sorted(sample, key=lambda p: p.episode_id)[2] == pairs[2]  # token ids and labels round-trip
