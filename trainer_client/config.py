"""The trainer's one validated configuration: YAML file, then preset, then CLI overrides.

Everything is checked when the config loads (pydantic), before any model is built or any
server contacted: an unknown shaping strategy, bad strategy params, a negative channel weight,
or a replay channel without teachers fails with a clear message.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from env_server.client import GRADED_EPISODE_WAIT_S
from env_server.protocol.markers import Role
from env_server.protocol.models import AUTH_TOKEN_ENV
from trainer_client.credit.gigpo import GiGPOConfig
from trainer_client.credit.shaping import RewardShapingConfig
from trainer_client.losses.base import channel_class
from trainer_client.losses.settings import ReplayConfig, SDPOConfig
from trainer_client.policies.settings import PoliciesConfig
from trainer_client.rollout.branches import StateSettings

__all__ = [
    "ORACLE_TEACHERS",
    "PRESETS",
    "RENAMED_KEYS",
    "TINY_MODELS",
    "TINY_TEACHER_SEEDS",
    "ChannelConfig",
    "EvalConfig",
    "GiGPOConfig",
    "ReplayConfig",
    "RewardFunctionConfig",
    "SDPOConfig",
    "TrainConfig",
    "config_error_line",
    "load_config",
    "tiny_model_teachers",
]

#: Two ground-truth oracle teachers (the CPU demo's config names them): runs with oracle teachers
#: are gold-supervised and are labelled so in logs and reports. Never a default.
ORACLE_TEACHERS: list[dict[str, str]] = [{"name": "oracle-a", "kind": "oracle"}, {"name": "oracle-b", "kind": "oracle"}]

#: Seeds of the tiny models' default teachers (``<model>@<seed>``); the policy is seed 0.
TINY_TEACHER_SEEDS = (1, 2, 3)


def tiny_model_teachers(model: str) -> list[dict[str, Any]]:
    """The teachers of trace replay when the model is an offline tiny model and none are
    configured: teachers that can be wrong, never oracles. Three local ``hf`` models asked in the
    tool layout the policy was trained in, each the policy's own recipe (warm-up data of the
    warm-up split only, never validation or held-out problems) with another seed and a warm-up
    half as long again (``<model>@1..3``, ``tiny_model.teacher_spec``): models of the policy's
    kind, measured in the README against the starting policy, so a pair (two of them agreeing
    against the student) carries what such a model knows, not the reference solution. Greedy,
    at most 128 new tokens."""
    return [{"name": f"{model}@{seed}", "kind": "hf", "model": f"{model}@{seed}", "layout": "tools",
             "max_tokens": 128} for seed in TINY_TEACHER_SEEDS]

#: ``model`` names of the offline tiny models: ``tiny`` (format warm-up, random answers: the demo's)
#: and ``tiny-learning`` (warm-up on the easy ``single_digit_sum`` family, partly right: the
#: learning experiment's; ``trainer_client.tiny_models.build.learning_spec``).
TINY_MODELS: dict[str, str] = {"tiny": "default_spec", "tiny-learning": "learning_spec", "tiny-sums": "sums_spec",
                               "tiny-div": "division_spec", "tiny-div-r2": "division_rounds_spec"}

#: Config keys that were renamed, old -> new: a config or override with the old key fails with
#: one line naming the new one (never silently ignored).
RENAMED_KEYS: dict[str, str] = {"aux_losses": "channels"}

#: Ablation presets: (alpha for SDPO, beta for trace-replay DPO).
PRESETS: dict[str, tuple[float, float]] = {
    "baseline": (0.0, 0.0),
    "sdpo": (0.1, 0.0),
    "replay": (0.0, 0.05),
    "full": (0.1, 0.05),
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RewardFunctionConfig(_Strict):
    """A user reward function (:mod:`trainer_client.credit.reward_functions`).

    Attributes:
        path: ``"package.module:function"``, importable by the trainer (checked when the
            config loads).
        mode: ``pointwise`` or ``batch``; decides over the decorator and the signature.
        timeout_s: per call; default: the decorator's (10 s).
        workers: worker processes running it.
        use_score: a valid ``score`` replaces the episode reward ``G`` before shaping; an invalid
            one keeps the server's reward.
    """

    path: str
    mode: Literal["pointwise", "batch"] | None = None
    timeout_s: float | None = Field(default=None, gt=0)
    workers: int = Field(default=1, ge=1)
    use_score: bool = True

    @model_validator(mode="after")
    def _importable(self) -> RewardFunctionConfig:
        from trainer_client.credit.reward_functions import load_reward_function

        try:
            load_reward_function(self.path, self.mode, self.timeout_s)
        except (ImportError, AttributeError, TypeError) as exc:
            raise ValueError(f"reward_function.path {self.path!r}: {exc}") from None
        return self

    def spec(self):
        """The :class:`~trainer_client.credit.reward_functions.RewardFunctionSpec` it names."""
        from trainer_client.credit.reward_functions import load_reward_function

        return load_reward_function(self.path, self.mode, self.timeout_s)


class ChannelConfig(_Strict):
    """One more loss channel (:mod:`trainer_client.losses.base`): ``total += weight · loss``.

    Attributes:
        name: a registered name (``register_channel``) or ``"package.module:Class"``.
        weight: its weight in the total loss.
        roles: the roles whose tokens it acts on (default: the trained roles).
        params: keyword arguments of the class.
    """

    name: str
    weight: float = Field(default=1.0, ge=0)
    roles: list[Role] | None = None
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known(self) -> ChannelConfig:
        try:  # fails at load, naming the registered losses
            channel_class(self.name)
        except (KeyError, ImportError, AttributeError, TypeError) as exc:
            raise ValueError(str(exc).strip('"')) from None
        return self


class EvalConfig(_Strict):
    """Evaluation during training (``eval_steps``): the policy on a fixed set of *validation*
    problems of ``problems`` (seeds ``VALIDATION_SEED_BASE + i``, never the held-out split;
    :mod:`env_server.debate.problems.splits`), through the held-out evaluation's code
    (:func:`~trainer_client.evaluation.policy_eval.evaluate_policy`), logged as ``eval/...``
    (:mod:`trainer_client.evaluation.during_training`).

    Attributes:
        problems: validation problems evaluated each time (the same ones every time).
        k: samples per problem for ``eval/sampled_accuracy`` (avg@k) and ``eval/pass_at_k``;
            0: greedy only.
        debate_k: sampled whole debates per problem for ``eval/sampled_final_accuracy``; 0: the
            greedy debate only (``eval/final_accuracy``).
        temperature: the samples' temperature; ``None``: the run's ``temperature``.
        max_new_tokens: longest generated turn; ``None``: the run's ``max_completion_length``.
        max_rounds: the validation debates' rounds; ``None``: the run's ``max_rounds``, else 1
            (the run leaves the rounds to the server, whose default the trainer cannot read).
        batch_size: prompts per generation batch.
        on_start: evaluate before the first step too (step 0), as TRL's ``eval_on_start``; a
            resumed run does not evaluate at its start (its checkpoint's step was evaluated or
            was not due).
        sample_seed: torch seed of the samples (the training generators are restored after).
    """

    problems: int = Field(default=32, ge=1)
    k: int = Field(default=4, ge=0)
    debate_k: int = Field(default=0, ge=0)
    temperature: float | None = Field(default=None, gt=0)
    max_new_tokens: int | None = Field(default=None, ge=1)
    max_rounds: int | None = Field(default=None, ge=1, le=16)
    batch_size: int = Field(default=64, ge=1)
    on_start: bool = True
    sample_seed: int = 0


class TrainConfig(_Strict):
    """``mathdebate train`` settings (see ``configs/`` for examples).

    Attributes:
        model: a Hugging Face causal LM id or path, or an offline tiny model (``"tiny"``,
            ``"tiny-learning"``; see :data:`TINY_MODELS`).
        env_url: the env server, or several replicas as a comma-separated string (a YAML list
            is joined): each session goes to the least-loaded healthy replica.
        env_token_env: environment variable holding the server's bearer token, if any.
        problems: the server's problem source (only the oracle teacher needs it).
        output_dir: metrics, plot, checkpoints and pairs go here.
        max_steps, learning_rate, per_device_train_batch_size, gradient_accumulation_steps,
        num_generations, max_completion_length, temperature, loss_type, kl_beta, seed,
        logging_steps, save_steps, report_to, generation_kwargs: TRL ``GRPOConfig`` settings
            (``kl_beta`` is its ``beta``; ``save_steps`` 0 saves only at the end; ``report_to``
            e.g. ``["tensorboard"]``; ``generation_kwargs`` go to Hugging Face's
            ``GenerationConfig`` or vLLM's ``SamplingParams``, e.g. ``{min_new_tokens: 256}``,
            which ``benchmarks/trainer_overhead.py`` uses to force every completion to one length).
        max_tool_calling_iterations: model turns per rollout (a debate needs up to
            ``2·max_rounds + 1`` tool calls).
        max_rounds: per-episode override of the server's rounds.
        mode: the episode mode of every training episode (RFC 0006): ``debate`` (solver,
            verifier, judge) or ``single`` (the solver answers once and the episode is graded
            on that answer: the single-agent baseline). In ``single`` mode only solver turns
            exist, so there are no verifier or judge items (no ``debate/reward/verifier``
            metric). Every built-in shaping strategy works there, on the solver items alone, so
            none is refused: ``identity``, ``difference_rewards`` (``G − 0``) and
            ``reward_mixing`` (the solver's local reward is ``G``) give the raw reward;
            ``coma_advantage`` keeps the solver's group-mean baseline (its verdict
            counterfactual has no verdict to read, and no verdict forward pass runs);
            ``potential_based`` adds its format bonus as in ``debate`` mode. Of the offline
            models, ``tiny`` is warmed up on single-mode episodes too, ``tiny-learning`` only on
            debates.
        dataset_size: distinct problems (seeds) in the training dataset.
        rewards_timeout_s: how long to wait for an episode's graded record.
        use_vllm, vllm_mode, vllm_server_base_url, vllm_gpu_memory_utilization: generation
            with vLLM (GPU extra); the CPU path uses Hugging Face generation.
        reward_shaping: the role-mapped shaping strategy (missing: identity).
        scale_advantages: divide by the per-role group std (TRL's ``scale_rewards="group"``).
        sdpo, replay: the two extra loss channels.
        advantage_estimator: ``grpo`` (group normalisation per role), ``grpo_turn`` (per role and
            that role's k-th turn, :func:`trainer_client.credit.role_samples.turn_group_values`) or ``gigpo``
            (episode- plus step-level group advantages, :mod:`trainer_client.credit.gigpo`) or
            ``grpo_state`` (``grpo``, and at the verifier's and the solver's revision turns ``K``
            actions sampled from one observation, each graded by the server on a fork, with
            advantages within that state, AT-GRPO: :mod:`trainer_client.credit.state_groups`).
        gigpo: GiGPO settings.
        state: ``grpo_state``'s settings (:class:`~trainer_client.rollout.branches.StateSettings`).
        verdict_balance: ``batch``: class-balanced verdict credit (RL Tango, arXiv 2505.15034):
            each verifier turn's advantage times ``N / (K · n_c)``, ``n_c`` the batch's verifier
            turns reviewing an answer of its class (right or wrong), so a verifier shown mostly
            right answers is not credited mostly for accepting
            (:mod:`trainer_client.credit.verdict_balance`); ``none``: off.
        channels: further loss channels (:class:`ChannelConfig`), each added as ``weight · loss``.
        reward_function: an optional user reward function over the transcripts.
        shuffle_rewards: the shuffled-reward control of ``mathdebate ablate``: episode rewards
            are permuted within each batch before shaping, so the policy gets no signal about
            its own outcomes. Never set it for real training.
        resume_from_checkpoint: continue a run from its last complete checkpoint (``true``: in
            ``output_dir``; a path: that checkpoint, or the last complete one in that run
            folder); ``mathdebate train --resume [DIR]`` sets it. See
            :mod:`trainer_client.training.checkpoints` for what a checkpoint holds.
        unfinished_debate_reward: episode reward of a rollout that left its debate unfinished
            (it stopped calling tools or ran out of completion length, so the adapter forfeited
            turns); ``null`` keeps the server's grade, which then rests on the solver's answer
            alone and lets a policy skip the verifier and judge for free
            (:func:`~trainer_client.credit.pipeline.score_unfinished_debates`).
        policies: the policy of each role (:mod:`trainer_client.policies.settings`): a LoRA
            adapter, the frozen base or an endpoint; none: the shared policy.
        eval_steps: evaluate the policy on validation problems every this many steps (TRL's
            ``eval_steps``; and after the last step, and before the first with
            ``eval.on_start``); 0: never (the default of ``mathdebate train``).
        eval: what that evaluation measures (:class:`EvalConfig`).
    """

    model: str = "tiny"
    env_url: str = "http://127.0.0.1:8000"

    @field_validator("env_url", mode="before")
    @classmethod
    def _join_env_urls(cls, value: Any) -> Any:
        """A YAML list of replica URLs becomes the comma-separated form."""
        return ",".join(str(v) for v in value) if isinstance(value, list) else value

    env_token_env: str = AUTH_TOKEN_ENV
    problems: str | None = None
    output_dir: str = "outputs/train"
    max_steps: int = Field(default=10, ge=1)
    learning_rate: float = Field(default=1e-5, gt=0)
    per_device_train_batch_size: int = Field(default=4, ge=1)
    gradient_accumulation_steps: int = Field(default=1, ge=1)
    num_generations: int = Field(default=4, ge=2)
    max_completion_length: int = Field(default=512, ge=8)
    max_tool_calling_iterations: int = Field(default=8, ge=1)
    temperature: float = Field(default=1.0, gt=0)
    generation_kwargs: dict[str, Any] | None = None
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "dapo"
    kl_beta: float = Field(default=0.0, ge=0)
    seed: int = 0
    logging_steps: int = Field(default=1, ge=1)
    save_steps: int = Field(default=0, ge=0)
    report_to: list[str] = Field(default_factory=list)
    max_rounds: int | None = Field(default=None, ge=1, le=16)
    mode: Literal["debate", "single"] = "debate"
    dataset_size: int = Field(default=1024, ge=1)
    rewards_timeout_s: float = Field(default=GRADED_EPISODE_WAIT_S, gt=0)
    use_vllm: bool = False
    vllm_mode: Literal["colocate", "server"] = "colocate"
    vllm_server_base_url: str | None = None
    vllm_gpu_memory_utilization: float = Field(default=0.3, gt=0, le=1)
    reward_shaping: RewardShapingConfig = Field(default_factory=RewardShapingConfig)
    scale_advantages: bool = True
    sdpo: SDPOConfig = Field(default_factory=SDPOConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    advantage_estimator: Literal["grpo", "grpo_turn", "gigpo", "grpo_state"] = "grpo"
    gigpo: GiGPOConfig = Field(default_factory=GiGPOConfig)
    state: StateSettings = Field(default_factory=StateSettings)
    verdict_balance: Literal["none", "batch"] = "none"
    channels: list[ChannelConfig] = Field(default_factory=list)
    reward_function: RewardFunctionConfig | None = None
    shuffle_rewards: bool = False
    unfinished_debate_reward: float | None = 0.0
    resume_from_checkpoint: bool | str | None = None
    policies: PoliciesConfig = Field(default_factory=PoliciesConfig)
    eval_steps: int = Field(default=0, ge=0)
    eval: EvalConfig = Field(default_factory=EvalConfig)

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        """A key of :data:`RENAMED_KEYS` fails with one line naming its new name."""
        if isinstance(data, dict):
            for old, new in RENAMED_KEYS.items():
                if old in data:
                    raise ValueError(f"`{old}` is now `{new}` (rename it in the config or the -o override)")
        return data

    @model_validator(mode="before")
    @classmethod
    def _tiny_model_default_teachers(cls, data: Any) -> Any:
        """``model: tiny`` (or another tiny model) with replay on, no teachers and pairs that need
        them (not ``pair_source: group``): its default teachers (:func:`tiny_model_teachers`)."""
        if not isinstance(data, dict) or data.get("model", "tiny") not in TINY_MODELS:
            return data
        replay = data.get("replay")
        if replay is None or isinstance(replay, dict):
            replay = dict(replay or {})
            beta = replay.get("beta", 0.0)
            if (not replay.get("teachers") and isinstance(beta, int | float) and beta > 0
                    and replay.get("pair_source", "teachers") != "group"):  # group pairs ask no teacher
                return {**data, "replay": {**replay, "teachers": tiny_model_teachers(data.get("model", "tiny"))}}
        return data

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if self.replay.beta > 0 and self.replay.pair_source != "group" and len(self.replay.teachers) < 2:
            raise ValueError("replay.beta > 0 needs at least 2 teachers in replay.teachers "
                             "(a DPO pair needs two teachers that agree; replay.pair_source: group needs none)")
        if self.replay.ref_model_sync_steps is not None and self.policies.adapters:
            raise ValueError("replay.ref_model_sync_steps (a reference that follows the policy) is wired for the "
                             "shared policy only, not with per-role LoRA adapters (policies)")
        if self.per_device_train_batch_size * self.gradient_accumulation_steps % self.num_generations:
            raise ValueError("per_device_train_batch_size × gradient_accumulation_steps must be a multiple of "
                             "num_generations (TRL groups each prompt's rollouts in one generation batch)")
        if self.advantage_estimator == "grpo_state" and (self.sdpo.alpha > 0 or self.replay.beta > 0 or self.channels
                                                         or self.policies.active or self.kl_beta > 0 or self.use_vllm):
            raise ValueError("advantage_estimator grpo_state trains with TRL's GRPO loss alone for now: it does not "
                             "combine with loss channels, role policies, kl_beta > 0 or vLLM")
        if self.policies.active and self.use_vllm:
            raise ValueError("policies: role routing runs on Hugging Face generation (use_vllm: false); per-request "
                             "LoRA with vLLM is not wired yet")
        return self

    @property
    def gold_supervised(self) -> bool:
        """Whether trace replay is on with an oracle teacher (the reference solutions become DPO
        targets) or hint distillation shows its teacher the reference solution (``sdpo.hint:
        reference``, OPSD): such runs are labelled gold-supervised in logs and reports."""
        return ((self.replay.beta > 0 and any(t.kind == "oracle" for t in self.replay.teachers))
                or (self.sdpo.alpha > 0 and self.sdpo.hint == "reference"))

    @property
    def env_token(self) -> str | None:
        return os.environ.get(self.env_token_env) or None


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``data["a"]["b"] = value`` for ``dotted == "a.b"`` (sections created as needed).

    Eight lines of our own rather than a library: pydantic has no dotted-path update, and
    OmegaConf or Hydra (which do) would bring a second configuration system beside pydantic's
    validation for this one helper.

    Raises:
        ValueError: a parent key holds a value, not a section.
    """
    node = data
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ValueError(f"cannot set {dotted!r}: {key!r} is not a section")
    node[leaf] = value


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """``-o key=value`` pairs as ``{dotted key: YAML value}``.

    Raises:
        SystemExit: a pair without ``=`` or with an empty key (the message says what is expected).
    """
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"bad override {pair!r}: expected key=value (e.g. sdpo.alpha=0.1)")
        out[key] = yaml.safe_load(value)
    return out



def load_config(path: str | Path | None = None, preset: str | None = None,
                overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Load and validate a config.

    Args:
        path: YAML file (optional).
        preset: ``baseline``, ``sdpo``, ``replay`` or ``full``: sets ``sdpo.alpha`` and
            ``replay.beta`` (see :data:`PRESETS`).
        overrides: dotted keys to values (``{"max_steps": 2, "sdpo.token_clip": 5.0}``),
            applied last.

    Raises:
        FileNotFoundError: no such file.
        ValueError: unknown preset, a malformed override path, or YAML that is not a mapping.
        yaml.YAMLError: the file is not YAML.
        pydantic.ValidationError: the result is not a valid :class:`TrainConfig`.
    """
    data: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_text()
        data = yaml.safe_load(text) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: the config must be a mapping")
    if preset is not None:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
        alpha, beta = PRESETS[preset]
        _set_dotted(data, "sdpo.alpha", alpha)
        _set_dotted(data, "replay.beta", beta)
    for key, value in (overrides or {}).items():
        _set_dotted(data, key, value)
    return TrainConfig.model_validate(data)


def config_error_line(exc: BaseException) -> str:
    """A config error as one line for the command line (pydantic errors: ``location: message``
    for each, without the input), never a traceback."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        parts = []
        for error in exc.errors(include_url=False, include_input=False, include_context=False):
            where = ".".join(str(part) for part in error["loc"])
            message = error["msg"].removeprefix("Value error, ")
            parts.append(f"{where}: {message}" if where else message)
        return "; ".join(parts)
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    return " ".join(str(exc).split())
