"""What a resume reads and cuts back, on real files: the pair store and ``metrics.jsonl`` back
to a checkpoint's offsets, complete checkpoints found and incomplete ones skipped, the checks
that refuse a checkpoint the run cannot continue, and the weights fingerprint. The whole path
(a real run killed and resumed) is ``tests/e2e/test_resume.py``."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from env_server.jsonio import write_json_atomic
from env_server.protocol.markers import Role
from trainer_client.losses.pair_store import DpoPair, PairStore
from trainer_client.model.fingerprint import weights_fingerprint
from trainer_client.training.checkpoints import (
    RANK_DIR,
    STATE_FILE,
    ResumeError,
    complete_checkpoints,
    load_resume_state,
    resume_checkpoint,
)
from trainer_client.training.reporting import MetricsFileCallback, metrics_events, read_metrics


def _pair(step: int) -> DpoPair:
    return DpoPair(prompt_messages=[{"role": "user", "content": "1+1"}], chosen="\\boxed{2}", rejected="\\boxed{3}",
                   episode_id=f"e{step}", t=0, role=Role.SOLVER, teacher="a", created_step=step, context_ids=[1, 2],
                   chosen_ids=[3], rejected_ids=[4], ref_chosen_logp=-1.0, ref_rejected_logp=-2.0)


def test_pair_store_goes_back_to_a_checkpoint_and_refuses_another_file(tmp_path):
    store = PairStore(tmp_path / "pairs.jsonl")
    store.add([_pair(0), _pair(1)])
    state = store.state_dict()
    assert state == {"path": str(tmp_path / "pairs.jsonl"), "offset": (tmp_path / "pairs.jsonl").stat().st_size,
                     "count": 2}
    store.add([_pair(2), _pair(3)])  # stored after the checkpoint, by steps that are trained again
    with (tmp_path / "pairs.jsonl").open("a") as handle:
        handle.write('{"torn": ')  # and a line the kill cut
    reopened = PairStore(tmp_path / "pairs.jsonl")  # what a resumed process loads first
    assert len(reopened) == 4
    assert reopened.load_state_dict(state) == 2
    kept = PairStore(tmp_path / "pairs.jsonl").sample(9, random.Random(0))
    assert len(reopened) == 2 and sorted(p.created_step for p in kept) == [0, 1]
    assert (tmp_path / "pairs.jsonl").stat().st_size == state["offset"]
    with pytest.raises(ValueError, match="fewer than the checkpoint"):
        PairStore(tmp_path / "other.jsonl").load_state_dict(state)
    with pytest.raises(ValueError, match="the checkpoint says 3"):
        reopened.load_state_dict({**state, "count": 3})


def test_metrics_file_starts_with_its_event_and_a_resume_cuts_it_back(tmp_path):
    path = tmp_path / "metrics.jsonl"
    main = SimpleNamespace(is_world_process_zero=True, global_step=0)
    MetricsFileCallback(path, {"event": "start", "provenance": {}}).on_train_begin(None, main, None)
    callback = MetricsFileCallback(path)
    for step in (1, 2):
        callback.on_log(None, SimpleNamespace(is_world_process_zero=True, global_step=step), None,
                        logs={"loss/total": 0.5 * step, "debate/reward/solver": 1.0})
    offset = path.stat().st_size  # the checkpoint after step 2
    callback.on_log(None, SimpleNamespace(is_world_process_zero=True, global_step=3), None, logs={"loss/total": 9.0})
    worker = SimpleNamespace(is_world_process_zero=False)
    MetricsFileCallback(path, {"event": "resume", "from_step": 2}, keep_bytes=offset).on_train_begin(None, worker, None)
    assert [line["step"] for line in read_metrics(path)] == [1, 2, 3]  # only the main process writes
    MetricsFileCallback(path, {"event": "resume", "from_step": 2}, keep_bytes=offset).on_train_begin(None, main, None)
    assert [line["step"] for line in read_metrics(path)] == [1, 2]
    assert metrics_events(path) == [{"event": "start", "provenance": {}},
                                    {"event": "resume", "from_step": 2, "dropped_lines": 1}]


def _checkpoint(run, step, world_size=1, fingerprint="f" * 64, complete=True):
    path = run / f"checkpoint-{step}"
    (path / RANK_DIR).mkdir(parents=True)
    for rank in range(world_size):
        write_json_atomic(path / RANK_DIR / f"rank{rank}.json", {"channels": {}, "shaping": {"state": {}}})
    if complete:
        write_json_atomic(path / STATE_FILE, {"global_step": step, "world_size": world_size, "config": {"seed": 0},
                                              "reference_policy": {"model": "m", "weights_fingerprint": fingerprint},
                                              "metrics": {"offset": 0}})
    return path


def test_the_last_complete_checkpoint_is_found_and_an_incomplete_one_skipped(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(ResumeError, match="no complete checkpoint"):
        resume_checkpoint(True, run)
    two, ten = _checkpoint(run, 2), _checkpoint(run, 10)
    _checkpoint(run, 12, complete=False)  # killed while saving: no mathdebate_state.json
    assert complete_checkpoints(run) == [two, ten]
    assert resume_checkpoint(True, run) == ten == resume_checkpoint(str(run), run)
    assert resume_checkpoint(two, run) == two  # a checkpoint named directly
    with pytest.raises(ResumeError, match="a run continues in its own folder"):
        resume_checkpoint(ten, tmp_path / "elsewhere")


def test_a_checkpoint_of_another_process_count_or_initial_policy_is_refused(tmp_path, caplog):
    checkpoint = _checkpoint(tmp_path, 4, world_size=2)
    state = load_resume_state(checkpoint, 1, 2, {"seed": 0}, "f" * 64)
    assert state.step == 4 and state.rank == {"channels": {}, "shaping": {"state": {}}}
    with pytest.raises(ResumeError, match="2 training process"):
        load_resume_state(checkpoint, 0, 1, {"seed": 0}, "f" * 64)
    with pytest.raises(ResumeError, match=r"not the one .* was trained from"):
        load_resume_state(checkpoint, 0, 2, {"seed": 0}, "0" * 64)
    caplog.set_level("WARNING")
    load_resume_state(checkpoint, 0, 2, {"seed": 1, "output_dir": "elsewhere"}, "f" * 64)
    assert "differ from the checkpoint's: seed" in caplog.text and "output_dir" not in caplog.text


def test_weights_fingerprint_tells_models_apart(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    first = weights_fingerprint(model)
    assert weights_fingerprint(AutoModelForCausalLM.from_pretrained(tiny_model_dir)) == first
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] += 1e-3
    assert weights_fingerprint(model) != first


def test_resume_without_a_complete_checkpoint_exits_2_in_one_line(tmp_path, capsys):
    from trainer_client.cli import main

    run = tmp_path / "run"
    _checkpoint(run, 3, complete=False)
    assert main(["train", "--resume", str(run), "--model", "tiny", "-o", "save_steps=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot resume: no complete checkpoint in" in err[0] and "incomplete: checkpoint-3" in err[0]


def test_channels_sharing_a_name_keep_one_state_each() -> None:
    from types import SimpleNamespace

    from trainer_client.training.checkpoints import channel_keys

    channels = [SimpleNamespace(name="sdpo_jsd"), SimpleNamespace(name="trace_replay_dpo"), SimpleNamespace(name="sdpo_jsd")]
    assert channel_keys(channels) == ["sdpo_jsd", "trace_replay_dpo", "sdpo_jsd#2"]  # unique names stay as they were
