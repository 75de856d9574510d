"""The server's hot-path shortcuts give exactly what the general code gives.

- ``last_boxed``'s fast path (one ``\\boxed{`` with plain content) against the brace-matching
  scan, on generated texts built from the characters that matter;
- ``rewards.episode_rewards_data`` (the record as plain JSON data, which the server serialises
  with orjson) against the validated ``EpisodeRewards`` and its ``model_dump(mode="json")``, on
  every combination of grades in three debates.
"""

from __future__ import annotations

import itertools

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from env_server.debate.answers import _last_boxed_scan, last_boxed
from env_server.debate.episode import DebateEpisode
from env_server.debate.problems import load_problem_source
from env_server.debate.rewards import episode_rewards_data
from env_server.protocol.grades import Grade
from env_server.protocol.markers import ErrorKind
from env_server.protocol.models import DebateAction, EpisodeRewards

PIECES = ["\\boxed{", "\\boxed", "\\boxed {", "\\fbox{", "{", "}", "\\", "\\\\", "\\{", "\\}", "a", "12", " ", "boxed{",
          "\\frac{1}{2}", "\n"]


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=14))
def test_last_boxed_fast_path_matches_the_scan(pieces: list[str]) -> None:
    text = "".join(pieces)
    assert last_boxed(text) == _last_boxed_scan(text)


def test_last_boxed_fast_path_cases() -> None:
    assert last_boxed("So \\boxed{ 42 }.") == "42"
    assert last_boxed("\\boxed{}") == ""
    assert last_boxed("\\boxed{1} then \\boxed{2}") == "2"  # two boxes: the scan decides
    assert last_boxed("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"  # nested braces: the scan
    assert last_boxed("\\boxed{3 \\fbox{4}}") == "4"  # the last box opened
    assert last_boxed("\\boxed{5") is None  # unclosed


GRADES = [Grade(True, None, "exact"), Grade(False, None, "worker"), Grade(False, ErrorKind.GRADING_TIMEOUT, "worker"),
          Grade(False, ErrorKind.UNPARSEABLE_ANSWER, "rule")]


def _episodes():
    problem = load_problem_source(None).by_seed(5)
    answer = f"The answer is \\boxed{{{problem.answer}}}."
    scripts = [
        [("solver", answer), ("verifier", "VERDICT: CORRECT"), ("judge", answer)],
        [("solver", "no box"), ("verifier", "VERDICT: INCORRECT"), ("solver", answer), ("verifier", "hmm"),
         ("judge", "I cannot tell")],
        [("solver", "\\boxed{7}"), ("verifier", "VERDICT: CORRECT"), ("judge", "\\boxed{8}")],
    ]
    for i, script in enumerate(scripts):
        episode = DebateEpisode(f"ep{i}", problem, max_rounds=2, max_action_chars=10_000)
        for role, content in script:
            episode.step(DebateAction(role=role, content=content))
        yield episode


def test_record_data_is_the_validated_records_json_form_on_every_outcome() -> None:
    checked = 0
    for episode in _episodes():
        graded = [t.t for t in episode.turns if t.needs_grade]
        for combo in itertools.product(GRADES, repeat=len(graded)):
            grades = dict(zip(graded, combo, strict=True))
            data = episode_rewards_data(episode, grades, graded_at=1234.5, session_id="s1")
            record = EpisodeRewards.model_validate(data)  # the validated model of the same record
            assert record.model_dump(mode="json") == data
            # what the server sends is what pydantic would send
            assert orjson.loads(orjson.dumps(data)) == orjson.loads(record.model_dump_json())
            assert EpisodeRewards.model_validate_json(orjson.dumps(data)) == record
            checked += 1
    assert checked == 4**2 + 4**3 + 4**2


def test_reset_observation_from_the_template_is_the_serialised_one(math500_path) -> None:
    from env_server.debate.problems import load_problem_source as load

    problems = [load(None).by_seed(i) for i in range(20)] + [load(str(math500_path)).by_seed(i) for i in range(40)]
    for i, problem in enumerate(problems):
        for max_rounds in (1, 2, 3):
            for episode_id in (f"ep-{i}", "quote\"back\\slash\u00e9\u0000", "x" * 255):
                episode = DebateEpisode(episode_id, problem, max_rounds, max_action_chars=100)
                assert episode.last_observation == episode._serialize(None)
