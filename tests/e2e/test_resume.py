"""Checkpoints that hold the whole run: ``mathdebate train`` on the tiny model, with every loss
channel on (trace replay with two oracle teachers), killed with SIGKILL while a step is
in flight after a complete checkpoint and resumed with ``mathdebate train --resume DIR``,
against an uninterrupted run with the same settings; once in one process and once under
``torchrun`` with two processes (gloo).

Determinism: on this CPU path the resumed run's final weights and every step's metrics equal
the uninterrupted run's (measured: bitwise, a difference of 0.0; asserted to 1e-6). It takes a
checkpoint at every step (``save_steps=1``): trace replay's teachers answer in background
threads, and a checkpoint waits for them and stores their pairs, so which pairs a step can
draw does not depend on how fast the teachers were. Between checkpoints farther apart it does
(a pair made in step k is drawn from step k+1 or later, by thread timing), so such runs are
consistent after a resume (no step, pair or metric line twice) but not bit-for-bit the
uninterrupted run; nor is a run where a grade of a teacher's answer hits its 5 s limit (the
teachers' grader starts warm, so only a very loaded machine gets there).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import torch
from provenance_checks import check_provenance
from safetensors.torch import load_file

from env_server.cli import running_server
from env_server.client import MuxClient, MuxError
from env_server.debate.problems import load_problem_source
from trainer_client.rollout.sessions import SessionLedger
from trainer_client.training.checkpoints import STATE_FILE, complete_checkpoints
from trainer_client.training.reporting import metrics_events, read_eval_metrics, read_metrics

REPO = Path(__file__).resolve().parents[2]
#: one torch thread per training process: the runs compare bit for bit, and two processes on a
#: 2-core machine shared with other jobs do not fight over each other's cores
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
STEPS = 4
#: metrics that depend on the clock or the process, not on the training: timings, the process's
#: peak memory (a resumed process has its own), and the teacher pool's counters, read while its
#: threads answer (the checkpoints' counters, read after waiting for them, are compared)
TIMING = ("time", "per_second", "memory/", "teachers/", "pairs/emitted", "pairs/gold_supervised", "pairs/graded",
          "pairs/correct", "pairs/precision")


def _settings(tiny_model_dir: str, url: str, out: Path) -> dict:
    return {"model": tiny_model_dir, "env_url": url, "output_dir": str(out), "max_steps": STEPS, "save_steps": 1,
            "per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 256, "max_rounds": 1,
            "learning_rate": 5e-4, "replay.teachers": [{"name": "a", "kind": "oracle"}, {"name": "b", "kind": "oracle"}],
            # an evaluation on validation problems before the first step and after each: none twice after a resume
            "eval_steps": 1, "eval.problems": 4, "eval.k": 2, "eval.max_new_tokens": 48}


def _train_command(settings: dict, processes: int = 1, resume: Path | None = None) -> list[str]:
    """``mathdebate train --preset full -o ...``, or ``mathdebate train --resume DIR -o ...``
    (the run's own config.yaml), in one process or under ``torchrun``."""
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
                if processes > 1 else [sys.executable])
    overrides = [arg for key, value in settings.items() for arg in ("-o", f"{key}={json.dumps(value)}")]
    start = ["--resume", str(resume)] if resume is not None else ["--preset", "full"]
    return [*launcher, "-m", "trainer_client.cli", "train", *start, *overrides]


def _stats(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/stats", timeout=10) as response:
        return json.loads(response.read())


def _kill_when(process: subprocess.Popen, ready: Callable[[], bool], delay_s: float, timeout_s: float = 240) -> None:
    """SIGKILL ``process`` and every process it started (torchrun's workers run in their own
    session), by pid, ``delay_s`` after ``ready()`` holds."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert process.poll() is None, f"the run ended (code {process.returncode}) before it could be killed"
        assert time.monotonic() < deadline, "the run never got there"
        time.sleep(0.01)
    time.sleep(delay_s)
    parent = psutil.Process(process.pid)
    for proc in [parent, *parent.children(recursive=True)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    process.wait(timeout=60)


def _attach_refused(url: str, session: dict) -> bool:
    async def attach() -> bool:
        async with MuxClient(url, reconnect=False) as client:
            try:
                await client.attach(session["session_id"], session["resume_token"])
            except MuxError as exc:
                return exc.code == "UNKNOWN_SESSION"
            return False
    return asyncio.run(attach())


def _same_training(reference: Path, resumed: Path) -> None:
    """The final weights and each step's metrics of two runs (timings aside)."""
    ref, res = load_file(reference / "final" / "model.safetensors"), load_file(resumed / "final" / "model.safetensors")
    assert ref.keys() == res.keys()
    for name in ref:
        torch.testing.assert_close(res[name], ref[name], rtol=0, atol=1e-6, msg=name)
    # what the channels carry from step to step: the pair-sampling stream, the store, the teacher calls used
    for rank in sorted(p.name for p in (reference / f"checkpoint-{STEPS}" / "mathdebate").iterdir()):
        ref_state, res_state = (json.loads((run / f"checkpoint-{STEPS}" / "mathdebate" / rank).read_text())["channels"]
                                for run in (reference, resumed))
        for state in (ref_state, res_state):
            state["trace_replay_dpo"]["pair_store"].pop("path")
        assert res_state == ref_state
    ref_lines, res_lines = read_metrics(reference / "metrics.jsonl"), read_metrics(resumed / "metrics.jsonl")
    assert [line["step"] for line in res_lines] == [line["step"] for line in ref_lines] == list(range(1, STEPS + 1))
    for expected, got in zip(ref_lines, res_lines, strict=True):
        keys = {key for key in expected if not any(word in key for word in TIMING)}
        assert keys == {key for key in got if not any(word in key for word in TIMING)}
        assert {k: got[k] for k in keys} == pytest.approx({k: expected[k] for k in keys}, rel=1e-6, abs=1e-9)
    # the evaluations during training: one at each step (0: before the first), each as the uninterrupted run's
    ref_evals, res_evals = read_eval_metrics(reference / "metrics.jsonl"), read_eval_metrics(resumed / "metrics.jsonl")
    assert [line["step"] for line in res_evals] == [line["step"] for line in ref_evals] == list(range(STEPS + 1))
    for expected, got in zip(ref_evals, res_evals, strict=True):
        assert {k: v for k, v in got.items() if k != "eval/seconds"} == \
            pytest.approx({k: v for k, v in expected.items() if k != "eval/seconds"}, rel=1e-6, abs=1e-9)


def _pair_keys(path: Path) -> list[tuple]:
    """The pairs of a store in order, by what does not depend on the episode ids."""
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [(r["created_step"], r["t"], r["role"], tuple(r["context_ids"]), tuple(r["chosen_ids"]),
             tuple(r["rejected_ids"]), round(r["ref_chosen_logp"], 4), round(r["ref_rejected_logp"], 4)) for r in rows]


def _train(command: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def _warnings(*runs: subprocess.CompletedProcess) -> str:
    """The runs' warnings (a teacher replay that failed, a grade that timed out), for a failure's message."""
    return "\n".join(line for run in runs for line in run.stderr.splitlines() if " WARNING " in line)


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_last_complete_checkpoint_as_if_never_killed(tiny_model_dir, tmp_path) -> None:
    fingerprint = load_problem_source(None).fingerprint()
    # a server of its own: its session count shows what the killed trainer left open
    with running_server(["--grading-workers", "1"]) as url:
        reference = tmp_path / "reference"
        uninterrupted = _train(_train_command(_settings(tiny_model_dir, url, reference)))

        out = tmp_path / "run"
        killed = subprocess.Popen(_train_command(_settings(tiny_model_dir, url, out)), cwd=REPO, env=ENV,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # in the step after checkpoint-2: its episodes are being played
        _kill_when(killed, lambda: (out / "checkpoint-2" / STATE_FILE).exists(), delay_s=0.1)
        assert killed.returncode == -signal.SIGKILL
        [*_, last] = complete_checkpoints(out)
        step = int(last.name.split("-")[1])
        assert 2 <= step < STEPS
        lines_at_kill = read_metrics(out / "metrics.jsonl")
        evaluations_at_kill = read_eval_metrics(out / "metrics.jsonl")
        assert [line["step"] for line in evaluations_at_kill][:3] == [0, 1, 2]
        pairs_at_kill = (out / "replay_pairs.jsonl").read_bytes()
        left_open = SessionLedger(out / "env_sessions.jsonl").open_sessions()
        assert len(left_open) == 4  # one session per environment (4 rollouts a batch)
        time.sleep(0.5)  # grading of finished debates settles
        at_kill = _stats(url)
        assert at_kill["sessions"] == len(left_open)  # waiting for their client (the resume window)
        assert at_kill["episodes_started"] > at_kill["episodes_graded"]  # debates were in flight

        resumed = _train(_train_command({"env_url": url}, resume=out))
        # the killed run's sessions were closed at the start, the resumed run's own at its end
        assert f"closed {len(left_open)} env session(s) an earlier process of this run left open" in resumed.stderr
        assert _stats(url)["sessions"] == 0
        assert all(_attach_refused(url, session) for session in left_open)
        assert SessionLedger(out / "env_sessions.jsonl").open_sessions() == []

    # no step trained twice: the last checkpoint's state ends at the last step, each step logged once
    state = json.loads((out / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    assert state["global_step"] == STEPS
    assert [entry["step"] for entry in state["log_history"] if "loss" in entry] == list(range(1, STEPS + 1))
    # metrics.jsonl: the start line, the killed run's steps up to the checkpoint, a resume line, the rest
    start, resume = metrics_events(out / "metrics.jsonl")
    assert start["event"] == "start" and resume["event"] == "resume"
    assert resume["from_step"] == step and resume["checkpoint"] == str(last)
    # (an evaluation is logged before its step's checkpoint: the checkpoint step's is kept)
    assert resume["dropped_lines"] == sum(line["step"] > step for line in [*lines_at_kill, *evaluations_at_kill])
    assert [line["step"] for line in read_metrics(out / "metrics.jsonl")] == list(range(1, STEPS + 1))
    # the pair store: the killed run's pairs up to the checkpoint kept as they were, none twice
    offset = json.loads((last / "mathdebate" / "rank0.json").read_text())["channels"]["trace_replay_dpo"]["pair_store"]
    assert (out / "replay_pairs.jsonl").read_bytes()[: offset["offset"]] == pairs_at_kill[: offset["offset"]]
    pairs = _pair_keys(out / "replay_pairs.jsonl")
    assert pairs and len(set(pairs)) == len(pairs)
    assert pairs == _pair_keys(reference / "replay_pairs.jsonl"), _warnings(uninterrupted, resumed)
    # and the training is the uninterrupted run's
    _same_training(reference, out)
    # provenance: beside the outputs, with the resume's own, and in metrics.jsonl's event lines
    record = json.loads((out / "provenance.json").read_text())
    assert [entry["from_step"] for entry in record["resumes"]] == [step]
    for entry in (record, record["resumes"][0], start["provenance"], resume["provenance"]):
        check_provenance(entry, [fingerprint])
        assert entry["env_servers"][0]["url"] == url
    assert record["config"]["max_steps"] == STEPS and record["resumes"][0]["config"]["resume_from_checkpoint"] == str(out)


@pytest.mark.slow  # three two-process runs: 55 s on 2 shared cores at a load of 3 to 4, 136 s at 7 (one process: 38 s, 100 s)
def test_two_processes_killed_and_resumed_train_as_if_never_killed(server_url, tiny_model_dir, tmp_path) -> None:
    """The same under ``torchrun`` with two CPU processes (gloo): each process keeps its own
    pairs, random streams and env sessions, and gets them back."""
    reference = tmp_path / "reference"
    uninterrupted = _train(_train_command(_settings(tiny_model_dir, server_url, reference), processes=2))

    out = tmp_path / "run"
    killed = subprocess.Popen(_train_command(_settings(tiny_model_dir, server_url, out), processes=2), cwd=REPO, env=ENV,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _kill_when(killed, lambda: (out / "checkpoint-2" / STATE_FILE).exists(), delay_s=0.1)
    [*_, last] = complete_checkpoints(out)
    step = int(last.name.split("-")[1])
    assert 2 <= step < STEPS and sorted(p.name for p in (last / "mathdebate").iterdir()) == ["rank0.json", "rank1.json"]
    left_open = [SessionLedger(out / f"env_sessions.rank{rank}.jsonl").open_sessions() for rank in (0, 1)]
    assert all(left_open)

    resumed = _train(_train_command({"env_url": server_url}, processes=2, resume=out))
    for sessions in left_open:
        assert all(_attach_refused(server_url, session) for session in sessions)
    assert [line["step"] for line in read_metrics(out / "metrics.jsonl")] == list(range(1, STEPS + 1))
    assert [event["event"] for event in metrics_events(out / "metrics.jsonl")] == ["start", "resume"]
    for rank in (0, 1):
        pairs = _pair_keys(out / f"replay_pairs.rank{rank}.jsonl")
        assert len(set(pairs)) == len(pairs)
        assert pairs == _pair_keys(reference / f"replay_pairs.rank{rank}.jsonl"), _warnings(uninterrupted, resumed)
    _same_training(reference, out)
