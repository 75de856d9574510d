"""Training end to end on CPU against a live env server: plain TRL GRPOTrainer through
environment_factory, every ablation preset of DebateGRPOTrainer, and shaping reaching the loss."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from trainer_client.losses.pair_store import PairStore
from trainer_client.rollout.environment import environment_factory
from trainer_client.rollout.tools import DEBATE_SYSTEM_PROMPT
from trainer_client.training.reporting import LOSS_KEYS, read_metrics
from trainer_client.training.train import run_training
from trainer_client.trl_compat import checkpointing_off

REPO = Path(__file__).resolve().parents[2]


def test_plain_grpo_trainer_trains_through_environment_factory(server_url, tiny_model_dir, tmp_path) -> None:
    """The proof that any TRL trainer can connect: stock GRPOTrainer, our environment class,
    the environment's get_reward as the only reward."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    dataset = Dataset.from_list([
        {"prompt": [{"role": "system", "content": DEBATE_SYSTEM_PROMPT}, {"role": "user", "content": ""}], "seed": i}
        for i in range(8)])
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=256, max_steps=2, logging_steps=1, report_to=[],
                      save_strategy="no", **checkpointing_off(GRPOConfig), max_tool_calling_iterations=6, seed=1)
    trainer = GRPOTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                          environment_factory=environment_factory(server_url, max_rounds=1))
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "rewards/DebateEnvironment/mean" in entry]
    assert len(logs) == 2
    # the model called the debate tools, and some calls went through
    assert sum(e["tools/call_frequency"] * (1 - e["tools/failure_frequency"]) for e in logs) > 0
    assert all(env.trace.record is not None for env in trainer.environments)  # every episode was graded
    # The warm-up and held-out prompts list the tools in the order TRL renders them (its private
    # _env_tools, trl 1.16): a model warmed up on another order meets an unseen prompt in training.
    from trainer_client.rollout.tool_calls import tool_callables

    (env_tools,) = trainer._env_tools.values()
    trl_order = [tool.__name__ for tool in env_tools]
    assert [tool.__name__ for tool in tool_callables()] == trl_order


def channels_config(out: Path, server_url: str, steps: int):
    """Every loss channel on (preset ``full``) with two ground-truth oracle teachers for trace
    replay, the tiny ablation's batch layout: the set-up the channel tests start from."""
    from trainer_client.config import load_config

    return load_config(None, "full", {
        "model": "tiny", "env_url": server_url, "output_dir": str(out), "max_steps": steps,
        "per_device_train_batch_size": 32, "num_generations": 8, "max_completion_length": 256,
        "learning_rate": 3e-4, "max_rounds": 1, "logging_steps": 1, "dataset_size": 4096,
        "replay.teachers": [{"name": "oracle-a", "kind": "oracle"}, {"name": "oracle-b", "kind": "oracle"}],
        "replay.budget_per_step": 8, "replay.pairs_per_step": 2,
    })


def train(server_url: str, tiny_model_dir: str, out: Path, preset: str, steps: int = 2, **overrides):
    """``steps`` of :func:`channels_config` on the default tiny model against ``server_url`` (the
    built-in generator), at a small batch (4 rollouts, groups of 4) with reward mixing, then
    ``preset``'s channels and ``overrides``."""
    from trainer_client.credit.shaping import RewardShapingConfig

    config = channels_config(out, server_url, steps)
    updates: dict = {"model": tiny_model_dir, "problems": None, "per_device_train_batch_size": 4, "num_generations": 4,
                     "max_completion_length": 384, "learning_rate": 5e-4,
                     "reward_shaping": RewardShapingConfig(strategy="reward_mixing", params={"alpha": 0.5})}
    if preset != "full":
        from trainer_client.config import PRESETS

        alpha, beta = PRESETS[preset]
        updates["sdpo"] = config.sdpo.model_copy(update={"alpha": alpha})
        updates["replay"] = config.replay.model_copy(update={"beta": beta})
    updates.update(overrides)
    config = config.model_copy(update=updates)
    run_training(config, progress=False)
    return read_metrics(out / "metrics.jsonl")


@pytest.mark.parametrize("preset", ["baseline", "sdpo", "replay", "full"])
def test_each_ablation_preset_trains_two_steps(server_url, tiny_model_dir, tmp_path, preset) -> None:
    lines = train(server_url, tiny_model_dir, tmp_path / preset, preset)
    assert [line["step"] for line in lines] == [1, 2]
    for line in lines:
        assert all(key in line for key in LOSS_KEYS)
        assert "debate/reward/solver" in line and "debate/error_site_rate" in line
        assert 0.0 <= line["debate/unfinished_rate"] <= 1.0
        # what each channel on costs, per step (trainer_client.losses.costs)
        on = {"baseline": set(), "sdpo": {"sdpo"}, "replay": {"replay"}, "full": {"sdpo", "replay"}}[preset]
        assert {key for key in line if key.startswith("time/")} == {f"time/{name}_s" for name in on}
        assert all(line[f"time/{name}_s"] > 0 for name in on) and line["memory/peak_gib"] > 0.1
    assert (tmp_path / preset / "training.png").stat().st_size > 0
    assert (tmp_path / preset / "final" / "config.json").exists()
    if preset in ("sdpo", "full"):
        assert any(line["loss/sdpo_jsd"] > 0 for line in lines)  # the tiny model always errs somewhere
    else:
        assert all(line["loss/sdpo_jsd"] == 0 for line in lines)
    pairs = PairStore(tmp_path / preset / "replay_pairs.jsonl")
    if preset in ("replay", "full"):
        assert len(pairs) > 0
        stored = pairs.sample(99, __import__("random").Random(0))
        assert len(stored) == len(pairs)  # every pair has token ids and reference log-probs
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
        for pair in stored:
            # on the rollout's tokens: the context ends with the generation prompt the policy answered,
            # the rejected side is the policy's own message, the chosen side the oracle's solution as a
            # submit_solution call (the demo replays solver turns to two oracle teachers)
            assert tokenizer.decode(pair.context_ids).endswith("<|im_start|>assistant\n")
            assert pair.rejected_ids and pair.chosen_ids[-1] == tokenizer.eos_token_id
            chosen = tokenizer.decode(pair.chosen_ids)
            assert '"name": "submit_solution"' in chosen and chosen.endswith("</tool_call><|im_end|>")
            assert pair.role == "solver" and pair.gold_supervised
    else:
        assert len(pairs) == 0 and all(line["loss/trace_replay_dpo"] == 0 for line in lines)


def test_shaping_reaches_the_gradient(server_url, tiny_model_dir, tmp_path) -> None:
    """Same seed, same first rollouts; identity vs reward mixing must give different gradient
    norms (with identity every role gets the team reward, always 0 for the tiny model, so its
    gradient is 0; mixing in the verifier's own reward moves it)."""
    from trainer_client.credit.shaping import RewardShapingConfig

    identity = train(server_url, tiny_model_dir, tmp_path / "identity", "baseline", steps=3,
                     reward_shaping=RewardShapingConfig())
    mixing = train(server_url, tiny_model_dir, tmp_path / "mixing", "baseline", steps=3,
                   reward_shaping=RewardShapingConfig(strategy="reward_mixing", params={"alpha": 0.0}))
    assert identity[0]["debate/reward/verifier"] == mixing[0]["debate/reward/verifier"]  # same rollouts
    assert sum(line["grad_norm"] for line in identity) != pytest.approx(sum(line["grad_norm"] for line in mixing))


def test_train_command_validates_the_config_before_starting(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("reward_shaping:\n  strategy: no_such_strategy\n")
    done = subprocess.run([sys.executable, "-m", "trainer_client.cli", "train", "--config", str(bad),
                           "--env-url", "http://127.0.0.1:9"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2
    assert "no_such_strategy" in done.stderr and "identity" in done.stderr  # lists the available names
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1  # one clear line
    done = subprocess.run([sys.executable, "-m", "trainer_client.cli", "train", "--preset", "replay",
                           "--model", "some/model", "--env-url", "http://127.0.0.1:9"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2 and "at least 2 teachers" in done.stderr and "Traceback" not in done.stderr
    for args in (["--config", str(tmp_path / "missing.yaml")], ["-o", "max_steps=abc"]):
        done = subprocess.run([sys.executable, "-m", "trainer_client.cli", "train", *args],
                              capture_output=True, text=True, timeout=120, cwd=REPO)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_full_preset_on_the_tiny_model_needs_no_config_file() -> None:
    """``mathdebate train --preset full --model tiny`` without ``--config``: the tiny model's
    documented default teachers (local copies of its recipe with other seeds, never oracles;
    ``tests/trainer_client/losses/test_teacher_measures.py`` checks every tiny model's)."""
    from trainer_client.config import load_config, tiny_model_teachers

    config = load_config(None, "full", {"model": "tiny", "max_steps": 2})
    assert config.replay.beta > 0 and config.sdpo.alpha > 0
    assert [t.name for t in config.replay.teachers] == [t["name"] for t in tiny_model_teachers("tiny")]
    explicit = load_config(None, "full", {"model": "tiny", "replay.teachers": [
        {"name": "a", "kind": "oracle"}, {"name": "b", "kind": "oracle"}, {"name": "c", "kind": "oracle"}]})
    assert [t.name for t in explicit.replay.teachers] == ["a", "b", "c"]  # configured teachers are kept
    assert explicit.gold_supervised and not config.gold_supervised
    assert not load_config(None, "baseline", {"model": "tiny"}).gold_supervised
    # hint distillation shown the reference solution (OPSD) is gold-supervised too, only when on
    assert load_config(None, "sdpo", {"model": "tiny", "sdpo.hint": "reference"}).gold_supervised
    assert not load_config(None, "baseline", {"model": "tiny", "sdpo.hint": "reference"}).gold_supervised


def test_compose_trainer_service_runs_locally_on_cpu_against_the_env_service(tiny_model_dir, tmp_path) -> None:
    """What CI can check of `docker compose up` without Docker: the file's structure, and the
    trainer service's own command and config (``${TRAINER_CONFIG:-...}`` at its default), run on
    CPU against the env service's own command on loopback, with only the CPU overrides: the tiny
    model, vLLM off, one step, a smaller batch and length, ``sdpo.backend=gkd`` without
    liger-kernel, and the output directory (the ``/outputs`` volume). No key and no teacher: the
    default path has trace replay off and says so in one log line."""
    import importlib.util
    import re

    import yaml

    from env_server.cli import free_port, wait_healthy

    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    env, trainer, teacher = (compose["services"][name] for name in ("env", "trainer", "teacher"))
    assert trainer["depends_on"]["env"]["condition"] == "service_healthy"
    assert trainer["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert "outputs:/outputs" in trainer["volumes"] and "model-cache:/cache/huggingface" in trainer["volumes"]
    assert teacher["profiles"] == ["teacher"] and "profiles" not in trainer and "profiles" not in env
    assert "TEACHER_API_KEY" not in str(trainer.get("environment", {}))
    command = [re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", c) for c in trainer["command"]]  # compose's default substitution
    assert command[command.index("--env-url") + 1] == "http://env:8000"  # the env service by name

    port = free_port()
    serve = [c.replace("0.0.0.0", "127.0.0.1").replace("8000", str(port)).replace("/state", str(tmp_path / "state"))
             for c in env["command"]]
    assert "env-state:/state" in env["volumes"] and "--state-dir" in serve  # durable by default
    server = subprocess.Popen([sys.executable, "-m", "trainer_client.cli", *serve[1:]], cwd=REPO)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", timeout_s=60, process=server)
        train_cmd = [c.replace("/configs/", f"{REPO}/configs/").replace("http://env:8000", f"http://127.0.0.1:{port}")
                     for c in command]
        cpu = ["--model", tiny_model_dir, "--max-steps", "1", "-o", "use_vllm=false",
               "-o", "per_device_train_batch_size=4", "-o", "num_generations=4", "-o", "gradient_accumulation_steps=1",
               "-o", "max_completion_length=128", "-o", f"output_dir={tmp_path / 'out'}"]
        if importlib.util.find_spec("liger_kernel") is None:
            cpu += ["-o", "sdpo.backend=gkd"]
        done = subprocess.run([sys.executable, "-m", "trainer_client.cli", *train_cmd[1:], *cpu], cwd=REPO,
                              capture_output=True, text=True, timeout=600,
                              env={k: v for k, v in os.environ.items() if k != "TEACHER_API_KEY"})
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert "trace replay is off (replay.beta = 0)" in done.stderr
    out = tmp_path / "out"
    assert len(read_metrics(out / "metrics.jsonl")) == 1 and (out / "training.png").exists()


def test_compose_teacher_profile_config_gpus_and_volumes() -> None:
    """The teacher path's config (two local-vLLM teachers, no key), the GPU reservations the
    compose file's header states, and the named volumes the image's user owns."""
    import yaml

    from trainer_client.config import load_config

    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    teacher_config = load_config(REPO / "configs" / "gpu_qwen_teacher.yaml")
    assert teacher_config.replay.beta > 0 and len(teacher_config.replay.teachers) == 2
    assert {t.base_url for t in teacher_config.replay.teachers} == {"http://teacher:8001/v1"}
    assert all(t.api_key_env is None for t in teacher_config.replay.teachers)
    assert load_config(REPO / "configs" / "gpu_qwen.yaml").replay.beta == 0
    assert {"outputs", "model-cache", "env-state", "env-b-state", "env-c-state"} <= set(compose["volumes"])
    # replicas: same image and command as env, each with its own state volume, behind profiles
    for name in ("env-b", "env-c"):
        assert services[name]["command"] == services["env"]["command"] and services[name]["profiles"] == ["replicas", "lb"]
        assert f"{name}-state:/state" in services[name]["volumes"]
    assert services["lb"]["profiles"] == ["lb"] and "./deploy/nginx.conf:/etc/nginx/nginx.conf:ro" in services["lb"]["volumes"]
    nginx = (REPO / "deploy" / "nginx.conf").read_text()
    assert all(f"server {name}:8000" in nginx for name in ("env", "env-b", "env-c")) and "Upgrade $http_upgrade" in nginx
    assert "chown -R debate:debate /outputs /cache" in (REPO / "Dockerfile").read_text()
    gpus = [services[s]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for s in ("trainer", "teacher")]
    assert gpus == [["0"], ["1"]]


def test_gigpo_with_a_user_reward_function_trains_two_steps(server_url, tiny_model_dir, tmp_path) -> None:
    """Issue 5's end-to-end check: GiGPO advantages from a user reward function's step outputs,
    composed with shaping and both extra loss channels, against the live server."""
    from trainer_client.config import GiGPOConfig, RewardFunctionConfig

    lines = train(server_url, tiny_model_dir, tmp_path / "gigpo", "full", advantage_estimator="gigpo",
                  gigpo=GiGPOConfig(omega=1.0, gamma=0.9),
                  reward_function=RewardFunctionConfig(path="reward_fns:boxed_steps", timeout_s=30))
    assert [line["step"] for line in lines] == [1, 2]
    for line in lines:
        assert all(key in line for key in LOSS_KEYS)
        assert line["reward_function/invalid_fraction"] == 0  # ran in its worker, every rollout scored
        assert 0 < line["gigpo/anchor_fraction"] <= 1  # the first turn of a group is always shared
        assert "reward_function/unaligned_step_outputs" in line


def test_advantage_estimator_flag_and_bad_reward_function_fail_before_training(tmp_path) -> None:
    from trainer_client.config import load_config

    assert load_config(overrides={"advantage_estimator": "gigpo"}).advantage_estimator == "gigpo"
    with pytest.raises(ValueError, match="advantage_estimator"):
        load_config(overrides={"advantage_estimator": "ppo"})
    with pytest.raises(ValueError, match="no_such_module"):
        load_config(overrides={"reward_function": {"path": "no_such_module:f"}})


def test_replay_pairs_carry_the_reference_log_probs_of_the_step_0_policy(server_url, tiny_model_dir, tmp_path) -> None:
    """Trace-replay DPO's reference is the student's initial policy: a pair made after k >= 1
    optimiser steps carries the log-probs of the step-0 model, not of the policy of the moment."""
    import torch

    from trainer_client.losses.trace_replay import replay_pair_logps

    out = tmp_path / "replay"
    train(server_url, tiny_model_dir, out, "replay", steps=3)
    later = [p for p in PairStore(out / "replay_pairs.jsonl").sample(10_000, __import__("random").Random(0))
             if p.created_step >= 1]
    assert later, "no pair was made after the first optimiser step"
    assert all(p.has_token_ids for p in later)  # scored on the rollout's own tokens, no chat template involved
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)

    def logps(model_dir) -> tuple[list[float], list[float]]:
        model = AutoModelForCausalLM.from_pretrained(model_dir).train(False)
        with torch.no_grad():
            chosen, rejected = replay_pair_logps(model, later, pad_token_id=tokenizer.pad_token_id,
                                                 max_completion_length=384, device="cpu")
        return chosen.tolist(), rejected.tolist()

    initial_chosen, initial_rejected = logps(tiny_model_dir)
    assert [p.ref_chosen_logp for p in later] == pytest.approx(initial_chosen, rel=1e-4, abs=1e-3)
    assert [p.ref_rejected_logp for p in later] == pytest.approx(initial_rejected, rel=1e-4, abs=1e-3)
    # and the policy did move, so the policy of the moment would have given other numbers: outside
    # the tolerance the reference check above allows (not a fixed movement: training numerics vary)
    final_chosen, _ = logps(out / "final")
    assert any(abs(a - b) > max(1e-4 * abs(b), 1e-3) for a, b in zip(final_chosen, initial_chosen, strict=True))


def test_coma_gets_the_policys_verdict_probabilities(server_url, tiny_model_dir, tmp_path, monkeypatch) -> None:
    """With ``coma_advantage`` the trainer computes π(CORRECT) of each rollout's first verdict
    from the policy and hands it to the strategy in the ``verifier_accept_prob`` column."""
    from env_server.protocol.markers import Role
    from trainer_client.credit.shaping import RewardShapingConfig
    from trainer_client.credit.shaping.coma import ComaAdvantageStrategy

    seen: list[list] = []
    original = ComaAdvantageStrategy.shape

    def recording(self, batch):
        seen.append([p for p, role in zip(batch.accept_probs_or_none(), batch.roles, strict=True)
                     if role is Role.VERIFIER])
        return original(self, batch)

    monkeypatch.setattr(ComaAdvantageStrategy, "shape", recording)
    lines = train(server_url, tiny_model_dir, tmp_path / "coma", "baseline",
                  reward_shaping=RewardShapingConfig(strategy="coma_advantage"))
    assert [line["step"] for line in lines] == [1, 2] and len(seen) == 2
    probs = [p for batch in seen for p in batch]
    assert probs and all(p is None or 0.0 < p < 1.0 for p in probs)
    assert any(p is not None for p in probs), "no verdict probability reached the strategy"


def test_grpo_state_trains_every_branch_with_its_within_state_advantage(server_url, tiny_model_dir, tmp_path,
                                                                        monkeypatch) -> None:
    """``advantage_estimator: grpo_state`` against the live server: each verifier turn gets K
    actions from its one observation, each graded by the server on a fork (the continued one
    gets the grade the real episode gave the same action); every action the rollout did not
    continue with is a row of TRL's batch carrying AT-GRPO's within-state advantage on its own
    tokens, the continued one's advantage is on the rollout's turn; branch tokens count as sampled."""
    import trainer_client.trainer as trainer_module
    from trainer_client.rollout.branches import StateSettings

    seen = []
    original = trainer_module.state_credit

    def recording(output, groups, records, segments, dropped, **kwargs):
        rows = len(output["completion_ids"])
        before = output["num_items_in_batch"].item()
        metrics = original(output, groups, records, segments, dropped, **kwargs)
        seen.append((list(groups), list(records), list(segments), rows, before,
                     {k: v.clone() if hasattr(v, "clone") else v for k, v in output.items()}, metrics))
        return metrics

    monkeypatch.setattr(trainer_module, "state_credit", recording)
    lines = train(server_url, tiny_model_dir, tmp_path / "state", "baseline", steps=1, advantage_estimator="grpo_state",
                  state=StateSettings(branches=3), max_rounds=1)
    assert [line["step"] for line in lines] == [1] and len(seen) == 1
    groups, records, segments, rows, before, output, metrics = seen[0]
    assert groups and all(len(g.branches) == 3 and g.role.value == "verifier" for g in groups)
    assert all(b.reward is not None for g in groups for b in g.branches)  # the server graded every branch
    for g in groups:  # the fork's grade of the continued action is the real episode's grade of it
        (own,) = [b for b in g.branches if b.continued]
        (turn,) = [t for t in records[g.row].turns if t.t == g.t]
        assert own.reward == turn.reward
    appended = [(g, b, (b.reward - np.mean([x.reward for x in g.branches]))
                 / (np.std([x.reward for x in g.branches], ddof=1) + 1e-4))
                for g in groups for b in g.branches if not b.continued]
    assert metrics["credit/state_rows_appended"] >= len(appended) and len(output["completion_ids"]) == rows + int(
        metrics["credit/state_rows_appended"])
    loss_tokens = 0
    for k, (_, b, advantage) in enumerate(appended):
        row = rows + k
        mask = output["tool_mask"][row].bool()
        assert output["completion_ids"][row][mask].tolist() == list(b.completion_ids)  # the action, in the loss
        assert output["advantages"][row][mask].tolist() == pytest.approx([advantage] * len(b.completion_ids), abs=1e-5)
        loss_tokens += len(b.completion_ids)
    assert output["num_items_in_batch"].item() == before + loss_tokens
    for g in groups:  # the continued action's advantage is on the rollout's own turn
        (own,) = [(b, i) for i, b in enumerate(g.branches) if b.continued]
        (segment,) = [s for s in segments[g.row] if s.owner and s.owner.produced and s.owner.t == g.t]
        rewards = [x.reward for x in g.branches]
        expected = (own[0].reward - np.mean(rewards)) / (np.std(rewards, ddof=1) + 1e-4)
        assert output["advantages"][g.row, segment.start:segment.end].tolist() == pytest.approx(
            [expected] * (segment.end - segment.start), abs=1e-5)
    line = lines[0]
    assert line["credit/state_groups"] == len(groups) and 0 <= line["credit/state_groups_nonzero"] <= 1
    assert line["tokens/sampled"] >= loss_tokens
