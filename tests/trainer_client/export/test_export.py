"""``mathdebate export`` on real sources: a trajectory log written by a real server (subprocess,
real socket) while debates are played over ``/ws/mux``, and a real ``mathdebate eval`` output.
The SFT chats are checked against the observations the server actually sent; the episode rows
against the rewards records it pushed; the errors against real files broken on purpose. (One
training step of TRL's SFT and DPO trainers on exports: ``tests/e2e/test_export_training.py``.)"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import datasets
import pytest
from provenance_checks import check_provenance

from env_server.cli import running_server
from env_server.client import SyncMuxClient
from env_server.client.play import play
from env_server.debate.problems import ProblemGenerator
from trainer_client.cli import main
from trainer_client.export.command import export_datasets
from trainer_client.export.errors import (
    EmptySourceError,
    ExportError,
    MalformedLineError,
    MissingProblemError,
    UnknownSourceError,
)

GENERATOR = ProblemGenerator()


def _debates() -> list[tuple[Any, list[tuple[str, str]], str | None]]:
    """A debate with a rejected answer and a revision, a right one, a single-mode answer."""
    a, b, c = (GENERATOR.by_seed(s) for s in (3, 4, 5))
    revised = [("solver", "It is \\boxed{-999999}."), ("verifier", "Step 2 is wrong.\nVERDICT: INCORRECT"),
               ("solver", f"Fixed: \\boxed{{{a.answer}}}"), ("verifier", "VERDICT: CORRECT"), ("judge", f"\\boxed{{{a.answer}}}")]
    right = [("solver", f"\\boxed{{{b.answer}}}"), ("verifier", "VERDICT: CORRECT"), ("judge", f"\\boxed{{{b.answer}}}")]
    return [(a, revised, None), (b, right, None), (c, [("solver", f"\\boxed{{{c.answer}}}")], "single")]


@pytest.fixture(scope="module")
def played(tmp_path_factory) -> dict[str, Any]:
    """A real server's trajectory log: the three scripted debates above (with the chat the
    server sent before each turn and the pushed records) and 8 noisy ones from ``play``."""
    log = tmp_path_factory.mktemp("export") / "trajectories.jsonl"
    chats: dict[tuple[str, int], list[dict[str, str]]] = {}
    records = {}
    with running_server(["--grading-workers", "1", "--trajectory-log", str(log)]) as url:
        with SyncMuxClient(url) as client:
            session = client.open_session()
            for problem, turns, mode in _debates():
                result = session.reset(problem_id=problem.problem_id, mode=mode)
                for role, content in turns:
                    chats[(result.observation.episode_id, result.observation.t)] = [
                        m.model_dump() for m in result.observation.messages]
                    result = session.step(role, content)
                record = session.rewards(timeout_s=60)
                assert record is not None
                records[record.episode_id] = record
        report = asyncio.run(play(url, GENERATOR, episodes=8, concurrency=2, policy="noisy", p=0.5, seed=11,
                                  progress=False))
        assert report.failed == 0
    return {"log": log, "chats": chats, "records": records}


def test_sft_rows_are_the_chats_the_server_sent_with_the_turn_appended(played, tmp_path):
    report = export_datasets([played["log"]], tmp_path / "out")
    assert report.rows["episodes"] == 11
    sft = datasets.load_from_disk(str(tmp_path / "out" / "sft"))
    lines = [json.loads(line) for line in played["log"].read_text().splitlines()]
    assert len(sft) == report.rows["sft"] == sum(len(line["turns"]) for line in lines)
    by_key = {(row["episode_id"], row["t"]): row for row in sft}
    assert len(played["chats"]) == 9  # the scripted debates' 5 + 3 + 1 turns, each checked below
    for (episode_id, t), sent in played["chats"].items():
        row = by_key[(episode_id, t)]
        assert row["messages"][:-1] == sent
        assert row["messages"][-1]["role"] == "assistant"
    revision = by_key[(next(iter(played["records"])), 2)]  # the solver's revision after a rejection
    assert [m["role"] for m in revision["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert revision["reward"] == 1.0 and revision["correct"] is True
    first = by_key[(next(iter(played["records"])), 0)]
    assert first["reward"] == 0.0 and first["error_kind"] == "wrong_answer"
    assert first["hint_template_key"] == "solver/wrong_answer"
    assert set(sft["gold_supervised"]) == {None}  # a server log does not say who played
    assert set(sft["source"]) == {str(played["log"])}


def test_episode_rows_carry_the_pushed_records(played, tmp_path):
    export_datasets([played["log"]], tmp_path / "out", fmt="parquet")
    episodes = datasets.load_dataset("parquet", data_files=str(tmp_path / "out" / "episodes.parquet"), split="train")
    rows = {row["episode_id"]: row for row in episodes}
    for episode_id, record in played["records"].items():
        row = rows[episode_id]
        assert row["episode_reward"] == record.episode_reward
        assert row["mode"] == record.mode.value
        assert row["first_answer_correct"] == record.facts.first_answer_correct
        assert row["verifier_accepted"] == record.facts.verifier_accepted
        assert [(t["t"], t["reward"], t["error_kind"]) for t in row["turns"]] == [
            (t.t, t.reward, t.error_kind.value if t.error_kind else None) for t in record.turns]
        assert row["error_sites"] == sum(t.error_kind is not None for t in record.turns)
        assert row["problem"] == GENERATOR.get(record.problem_id).problem
        assert row["gold"] == GENERATOR.get(record.problem_id).answer
    assert rows[next(iter(played["records"]))]["error_kinds"] == ["wrong_answer"]
    card = (tmp_path / "out" / "README.md").read_text()
    assert str(played["log"]) in card and "config_name: episodes" in card and "gold supervision unknown" in card


def test_an_eval_output_is_gold_supervised_when_its_policies_are_scripted(server_url, tmp_path):
    eval_dir = tmp_path / "eval"
    assert main(["eval", "--env-url", server_url, "--limit", "3", "--policy", "scripted:reference", "--no-progress",
                 "--output-dir", str(eval_dir)]) == 0
    report = export_datasets([eval_dir], tmp_path / "out")
    sft = datasets.load_from_disk(str(tmp_path / "out" / "sft"))
    assert report.rows["episodes"] == 3 and len(sft) == report.rows["sft"] >= 9
    assert set(sft["policy"]) == {"scripted:reference"} and set(sft["gold_supervised"]) == {True}
    trajectories = [json.loads(line) for line in (eval_dir / "trajectories.jsonl").read_text().splitlines()]
    # the chat rebuilt from the transcript is the one the eval policy was given
    given = {(line["episode_id"], turn["t"]): turn["messages"] for line in trajectories for turn in line["turns"]}
    assert all(row["messages"][:-1] == given[(row["episode_id"], row["t"])] for row in sft)
    card = (tmp_path / "out" / "README.md").read_text()
    assert f"`{eval_dir}` (eval)" in card and "3 of 3 rows gold-supervised" in card and "`scripted:reference`" in card
    # provenance: the export's own (this checkout, packages, machine, its arguments), and the eval's under its source
    record = json.loads((tmp_path / "out" / "provenance.json").read_text())
    check_provenance(record)
    assert record["config"]["sources"] == [str(eval_dir)]
    given = json.loads((eval_dir / "results.json").read_text())["provenance"]
    assert record["sources"] == {str(eval_dir): given} and given["env_servers"][0]["url"] == server_url


# --------------------------------------------------------------------------- bad input


def test_unknown_layouts_and_empty_sources_are_refused(played, tmp_path):
    with pytest.raises(UnknownSourceError, match="no such file"):
        export_datasets([tmp_path / "missing.jsonl"], tmp_path / "out")
    (tmp_path / "stray").mkdir()
    (tmp_path / "stray" / "notes.txt").write_text("not a run")
    with pytest.raises(UnknownSourceError, match="not a layout export reads"):
        export_datasets([tmp_path / "stray"], tmp_path / "out")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(EmptySourceError, match="no lines"):
        export_datasets([empty], tmp_path / "out")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ExportError, match="must be empty"):
        export_datasets([played["log"]], tmp_path / "full")
    assert not (tmp_path / "out").exists()  # nothing written on refusal


def test_a_malformed_line_is_refused_with_its_number(played, tmp_path):
    lines = played["log"].read_text().splitlines()
    torn = tmp_path / "torn.jsonl"
    torn.write_text("\n".join([lines[0], lines[1][: len(lines[1]) // 2], *lines[2:]]) + "\n")
    with pytest.raises(MalformedLineError, match="line 2: not JSON") as caught:
        export_datasets([torn], tmp_path / "out")
    assert caught.value.line == 2 and caught.value.path == torn
    swapped = json.loads(lines[0])
    swapped["turns"][0]["role"] = "judge"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([lines[1], lines[2], json.dumps(swapped)]) + "\n")
    with pytest.raises(MalformedLineError, match="line 3: the turns and the rewards record's turns differ"):
        export_datasets([bad], tmp_path / "out")
    foreign = json.loads(lines[0])
    foreign["rewards"]["episode_reward"] = "high"
    bad.write_text(json.dumps(foreign) + "\n")
    with pytest.raises(MalformedLineError, match="line 1: invalid rewards record: episode_reward"):
        export_datasets([bad], tmp_path / "out")


def test_a_problem_no_source_holds_needs_problems(played, tmp_path):
    line = json.loads(played["log"].read_text().splitlines()[0])
    line["problem_id"] = line["rewards"]["problem_id"] = "test/algebra/1.json"
    moved = tmp_path / "math500.jsonl"
    moved.write_text(json.dumps(line) + "\n")
    with pytest.raises(MissingProblemError, match="pass the server's --problems"):
        export_datasets([moved], tmp_path / "out")


def test_the_command_prints_one_line_and_exits_2_on_bad_input(played, tmp_path, capsys):
    assert main(["export", str(tmp_path / "nothing"), "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mathdebate export: ") and "no such file" in err and "\n" not in err
    assert main(["export", str(played["log"]), "--output-dir", str(tmp_path / "out"), "--format", "parquet"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mathdebate export: sft ") and "episodes 11 rows" in out
    assert (tmp_path / "out" / "sft.parquet").exists() and (tmp_path / "out" / "README.md").exists()
