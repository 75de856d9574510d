"""The settings of the two built-in loss channels (``sdpo`` and ``replay`` in the config), in a
module of their own so that reading a config never imports torch."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from env_server.protocol.markers import Role
from trainer_client.losses.teachers import TeacherConfig

__all__ = ["SUCCESSFUL_TEMPLATE", "ReplayConfig", "SDPOConfig"]


#: How a successful sibling's action joins the teacher's hint (TRL 1.16 SDPO's ``solution_template``
#: wording, "Correct solution:"; ``{solution}`` is the sibling's action text).
SUCCESSFUL_TEMPLATE = "Correct solution from another attempt:\n\n{solution}"


class SDPOConfig(BaseModel):
    """Hint distillation at error sites (generalized JSD to a hint-conditioned self).

    Attributes:
        alpha: weight of the channel in the total loss (0 disables it).
        jsd_beta: mixture coefficient of the generalized JSD (GKD, Agarwal et al. 2024:
            ``β·KL(T‖M) + (1−β)·KL(S‖M)``, ``M = β·T + (1−β)·S``; 0.5: symmetric). The endpoints
            are the KLs, as both backends compute them: 0 is the forward ``KL(T‖S)`` (cross-entropy
            to the teacher, whose gradient on a confidently wrong student does not vanish as the
            JSD's does), 1 the reverse ``KL(S‖T)``. It is TRL's SDPO ``distillation_alpha``
            (``trl.experimental.sdpo.loss_utils.compute_divergence``, TRL 1.16): equal to 1e-6 at
            0, 0.5 and 1 (tested).
        temperature: softmax temperature of both distributions.
        token_clip: cap on each token's divergence, nats (``None``: no cap).
        max_sites_per_batch: most error sites distilled per micro-batch (the rest are skipped).
        roles: roles whose erring turns are distilled.
        backend: ``"gkd"`` (TRL's GKD ``generalized_jsd_loss`` on full logits; supports
            ``token_clip``) or ``"liger"`` (liger-kernel's ``LigerFusedLinearJSDLoss`` on
            hidden states, never materialising ``(N, V)`` logits; ``pip install
            'mathdebate[liger]'``; no ``token_clip``).
        hint: what the teacher context shows before an erring turn. ``"localised"`` (default):
            the turn's own hint where the rewards record gives one (``TurnReward.hint``: where
            the wrong answer goes wrong, RFC 0002 "Localised hints"), else the template of its
            ``hint_template_key``; ``"template"``: always the template; ``"reference"``: the
            problem's reference solution for solver and judge sites (OPSD, on-policy
            self-distillation with privileged information, arXiv 2601.18734; needs ``problems``
            in the train config; such a run is **gold-supervised**), the template for the others.
        restate: the hint message ends with the erring turn's own instructions (what its role
            was shown, problem included), so the task sits as far from the turn as it does
            without the hint. A hint between the problem and the turn broke a 2-layer model,
            which behaved as if it copied the problem's digits by their distance from the turn
            (docs/ablation/tiny-sums-validation).
        route: SRPO's sample routing (Sample-Routed Policy Optimization, arXiv 2604.02288):
            correct samples go to GRPO, failed ones to the distillation term only. In a debate
            the failed sample is the erring turn: the tokens of every error site this term
            distils leave the GRPO term's loss mask, every other token stays in it. SRPO's
            entropy-aware weighting of the distillation targets is not implemented. A site over
            ``max_sites_per_batch`` in its micro-batch is then in neither term.
        teacher_model_kind: the policy whose hinted self is the teacher, as TRL 1.16's SDPO
            names it (``SDPOConfig.teacher_model_kind``): ``"live"`` (default here; TRL's is
            ``ema``): the current policy, the teacher's context continuing from the GRPO
            forward's cache; ``"base"``: the initial policy (OPSD, arXiv 2601.18734, recommends
            the frozen initial policy): with LoRA adapters the base with the adapters off,
            otherwise a frozen copy made at step 0 (one more model in memory); ``"ema"``: an
            exponential moving average of the policy, ``θ_T ← (1 − r)·θ_T + r·θ`` after every
            optimizer step (TRL's ``SyncRefModelCallback.sync_target_model``, SDPO's
            ``teacher_sync_steps`` 1), a copy started at step 0 (one more model; not wired with
            LoRA adapters: refused). A teacher other than ``live`` runs its own full forward.
        teacher_update_rate: the EMA rate ``r`` (TRL's ``teacher_update_rate``, default 0.05).
        use_successful_as_teacher: SDPO's reprompt (arXiv 2601.20802; TRL's
            ``use_successful_as_teacher``): where another rollout of the same group played the
            same role's same turn with reward 1, the teacher's hint also shows that rollout's
            action (:data:`SUCCESSFUL_TEMPLATE`, TRL's ``solution_template`` wording). The text
            is the policy's own, not a reference solution: the run stays non-gold.
        failed_only: distil only the sites of rollouts whose episode reward is below 1 (SRPO's
            routing of failed samples to distillation, arXiv 2604.02288, at the rollout level;
            an erring turn that the debate repaired is left to GRPO).
        gate: which sites are distilled. ``"none"``: all. ``"teacher_disagrees"``: only those
            where the teacher, shown the hint, gives the student's own sampled tokens of the
            erring turn a lower mean log-prob than the student does (the hint moves it away from
            the error; a gold-free stand-in for "the teacher is measured better", which the
            channels audit found true at only 42% of sites); ``sdpo/gate_kept`` counts the kept
            sites per micro-batch.
    """

    model_config = ConfigDict(extra="forbid")

    alpha: float = Field(default=0.0, ge=0)
    jsd_beta: float = Field(default=0.5, ge=0, le=1)
    temperature: float = Field(default=1.0, gt=0)
    token_clip: float | None = Field(default=None, gt=0)
    max_sites_per_batch: int = Field(default=16, ge=1)
    roles: list[Role] = Field(default_factory=lambda: [Role.SOLVER, Role.VERIFIER])
    backend: Literal["gkd", "liger"] = "gkd"
    hint: Literal["localised", "template", "reference"] = "localised"
    restate: bool = True
    route: bool = False
    teacher_model_kind: Literal["live", "base", "ema"] = "live"
    teacher_update_rate: float = Field(default=0.05, gt=0, le=1)
    use_successful_as_teacher: bool = False
    failed_only: bool = False
    gate: Literal["none", "teacher_disagrees"] = "none"

    @model_validator(mode="after")
    def _check(self) -> SDPOConfig:
        if self.backend == "liger" and self.token_clip is not None:
            raise ValueError("sdpo.token_clip needs backend 'gkd' (liger's fused JSD has no per-token clip)")
        return self


class ReplayConfig(BaseModel):
    """N-teacher trace-replay DPO.

    Attributes:
        beta: weight of the channel in the total loss (0 disables it).
        dpo_beta: DPO's temperature.
        teachers: the teacher pool (at least 2 when ``beta > 0``: a pair needs 2 agreeing;
            none needed with ``pair_source: group``).
        budget_per_step: most teacher calls started per training step.
        pairs_per_step: pairs in the DPO term of one optimiser step, drawn once per step and
            dealt over its gradient-accumulation micro-batches (the same DPO batch whatever the
            accumulation); per process, like TRL's ``per_device_train_batch_size``, so a step of
            N processes averages N × ``pairs_per_step`` pairs. Each pair costs about one context
            plus two turns of forward and backward: about 0.17 of a plain GRPO step over 8
            rollouts of 512 tokens (README, "Performance").
        rpo_alpha: weight of a negative log-likelihood term on the chosen side, added to DPO's
            loss per pair (RPO: Pang et al. 2024, "Iterative Reasoning Preference
            Optimization", arXiv 2404.19733, Eq. 3; TRL's ``DPOConfig.rpo_alpha`` is the same
            idea): ``L = L_DPO − rpo_alpha · log π(y_w|x) / |y_w|`` (per-token mean), so the
            chosen side's likelihood is raised, not only the margin (pure DPO can widen the
            margin by pushing the rejected side down). 0: plain DPO.
        pair_tokens: which tokens DPO's margin sums over. ``"all"`` (DPO as published): every
            token of both sides. ``"disagreement"``: only where the two sides disagree
            (:func:`~trainer_client.losses.replay_pairs.disagreement_weights`): the shared
            prefix weighs 0, tokens after the first difference that both sides share weigh
            ``shared_weight``, the rest 1; the pairs then store per-token reference log-probs.
            The shared prefix cancels in DPO's margin anyway; what changes is the shared text
            after the first difference, which plain DPO pushes down on the rejected side (in the
            tiny model's pairs, 71% of the rejected tokens after the first difference equal the
            chosen side's at the same offset: ``docs/ablation/factorial/``).
        shared_weight: see ``pair_tokens`` (``"disagreement"`` only).
        max_pair_age: sample only pairs created within this many steps of the current one
            (``None``: any stored pair).
        heldout_pair_share: share of pairs (by a hash of their turn and token ids) kept out of
            training to monitor the channel: every ``monitor_every`` steps the preference
            accuracy (implicit reward of the chosen side above the rejected one's, as TRL's
            ``rewards/accuracies``) and the chosen and rejected log-probs on up to
            ``monitor_pairs`` of them are logged (``replay/heldout/*``), so saturation shows.
            Beside them ``replay/heldout/margin_above_start``: the share of those pairs whose
            margin ``log π(chosen) − log π(rejected)`` (sums over each side's tokens) is above
            the same margin under the frozen start policy (not the moving reference).
        monitor_every, monitor_pairs: see ``heldout_pair_share``. ``monitor_pairs`` has no upper
            bound; an ablation that reads the held-out figures should set it to 64 (issue 56: at
            least 50 held-out pairs evaluated per run; the default 16 is for cheap runs).
        roles: roles whose turns are replayed to teachers (and, with ``pair_source`` ``group``
            or ``both``, whose first turns are paired within a group).
        max_workers: threads running teacher calls.
        pairs_path: JSONL of pairs (default: ``<output_dir>/replay_pairs.jsonl``).
        ref_model_sync_steps: TR-DPO's reference that follows the policy (Gorbatovski et al.
            2024, arXiv 2404.09656, Eq. 4-5; TRL's ``DPOConfig.ref_model_sync_steps`` with
            ``sync_ref_model``): every this many optimizer steps the replay reference becomes
            ``α·θ_policy + (1 − α)·θ_ref`` (``α = ref_model_mixup_alpha``), and a drawn pair's
            reference log-probs are recomputed under the reference of the moment when they
            were computed before its last sync. ``None`` (default): the frozen initial policy,
            as before. Costs one more model copy in memory (the following reference, beside the
            frozen start policy). Full fine-tuning of the shared policy only: refused with
            per-role LoRA adapters.
        ref_model_mixup_alpha: TR-DPO's ``α`` in ``[0, 1]`` (TRL's default 0.6; 1: a hard copy
            of the policy, TR-DPO's "hard update"; 0: the reference never moves).
        draws_per_pair: ``None`` (default): each step's pairs are drawn uniformly among the
            stored pairs. Otherwise each stored, non-held-out pair is trained on at most this
            many times: a step draws its ``pairs_per_step`` among the pairs drawn fewest times
            so far (ties broken by the run's seeded pair stream) and a pair drawn this many
            times is retired; the counts are in the checkpoint.
        pair_source: where pairs come from. ``"teachers"`` (default): the teachers' answers
            against the student's turns. ``"group"``: the policy's own GRPO group, no teacher:
            for each group of rollouts of one prompt and each replayed role, the role's first
            turn of a rollout with server reward 1 against the same turn of a rollout with
            reward 0 on the same context tokens (at most one pair per group and role per
            batch; logged as ``replay/group_pairs``). ``"both"``: both sources.
        train_pairs: ``False`` makes the run a control of the channel (issue 56): pairs are built,
            stored and monitored exactly as at ``beta`` (teachers asked, ``replay/heldout/*``
            logged), but no DPO term enters the loss, so whatever moves the held-out pairs'
            margins is GRPO's doing. Needs ``beta > 0`` (the channel is built only then).
    """

    model_config = ConfigDict(extra="forbid")

    beta: float = Field(default=0.0, ge=0)
    train_pairs: bool = True
    dpo_beta: float = Field(default=0.1, gt=0)
    teachers: list[TeacherConfig] = Field(default_factory=list)
    budget_per_step: int = Field(default=16, ge=0)
    pairs_per_step: int = Field(default=4, ge=1)
    rpo_alpha: float = Field(default=0.0, ge=0)
    pair_tokens: Literal["all", "disagreement"] = "all"
    shared_weight: float = Field(default=0.0, ge=0, le=1)
    max_pair_age: int | None = Field(default=None, ge=0)
    heldout_pair_share: float = Field(default=0.1, ge=0, lt=1)
    monitor_every: int = Field(default=5, ge=1)
    monitor_pairs: int = Field(default=16, ge=1)
    roles: list[Role] = Field(default_factory=lambda: [Role.SOLVER])
    max_workers: int = Field(default=4, ge=1)
    pairs_path: str | None = None
    ref_model_sync_steps: int | None = Field(default=None, ge=1)
    ref_model_mixup_alpha: float = Field(default=0.6, ge=0, le=1)
    draws_per_pair: int | None = Field(default=None, ge=1)
    pair_source: Literal["teachers", "group", "both"] = "teachers"
