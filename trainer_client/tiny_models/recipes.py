"""The recipes of the offline tiny models: what each one's warm-up puts in and when it stops.

A recipe is a :class:`TinyModelSpec` (a plain dict, hashed into the build's marker);
:func:`~trainer_client.tiny_models.build.build_tiny_model` turns it into weights, and a
recipe with a committed build (``trainer_client/tiny_models/pinned/``) loads those instead.
``mathdebate``'s names (``tiny``, ``tiny-learning``, ``tiny-sums``, ``<name>@<seed>``) resolve
here (:func:`tiny_model_spec`, ``trainer_client.config.TINY_MODELS``).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "LEARNING_WARMUP_SEED_BASE",
    "TEACHER_OVERRIDES",
    "TEACHER_WARMUP_FACTOR",
    "TinyModelSpec",
    "default_spec",
    "division_rounds_spec",
    "is_tiny_model_name",
    "learning_spec",
    "sums_spec",
    "sums_spec_v1",
    "teacher_spec",
    "tiny_model_spec",
]


class TinyModelSpec(dict):
    """Build parameters (a plain dict, recorded in ``tiny_model.json`` to detect a stale cache)."""


def default_spec(seed: int = 0) -> TinyModelSpec:
    """The default tiny model (``model: tiny``; the tests' model): a 2-layer Qwen2 warmed up on
    ``debates`` one-round synthetic debates of the default problem rotation (random answers and
    verdicts: the point is the tool-call format) plus ``single_episodes`` single-mode episodes
    (RFC 0006: the solver's one ``submit_solution`` call, then the tool's "debate is over"), so
    that a ``mode: single`` run starts from a model that has seen that prompt. Version 8 added
    the single-mode episodes (40 of the 200 warm-up conversations)."""
    return TinyModelSpec(seed=seed, vocab_size=1024, hidden_size=128, layers=2, heads=4, kv_heads=2,
                         intermediate_size=256, max_positions=8192, debates=160, sft_steps=300, batch_size=6,
                         learning_rate=4e-3, single_episodes=40, version=8)


#: First problem seed of the learning warm-up (:func:`learning_spec`): warm-up problems use seeds
#: ``LEARNING_WARMUP_SEED_BASE + spec_seed * 10**6 + i``, disjoint from RL training seeds (a
#: training run uses ``config.seed + i`` for ``i < dataset_size``, far below 10**8) and from
#: held-out seeds (``>= trainer_client.evaluation.heldout.HELDOUT_SEED_BASE`` = 10**9).
LEARNING_WARMUP_SEED_BASE = 10**8  # = env_server.debate.problems.splits.WARMUP_SEED_BASE


def learning_spec(seed: int = 0) -> TinyModelSpec:
    """The tiny model for the learning experiment (``mathdebate ablate --model tiny``): the
    default size, warmed up on gold debates of the easy ``single_digit_sum`` family (worked
    solutions ``$a + b = s$. So the answer is $\\boxed{s}$.``), with a phrase-token tokenizer
    (``phrase_tokens``: the ~540-token solver prompt becomes ~70 tokens; with the word-level
    tokenizer the model never learned to read the problem: greedy accuracy stayed at chance).

    Stop rule, fixed before any RL run: 300 optimizer steps of a linear decay planned over 600
    (``sft_schedule_steps``), i.e. stopped halfway. With the rollout layout fixed (spec version 7,
    TRL's training chat template) step 300 gives 51-55% greedy held-out accuracy (300 validation
    and 200 held-out problems), sampled accuracy 38% and pass@8 82% at temperature 1. (Before the
    fix, the same recipe's curve was 13/25-32/50/81% at steps 200/300/400/600.)"""
    # No single-mode episodes, and the version the protocol run used: the published experiment's
    # warm-up (data, order, tokenizer, hash) stays exactly as it was (docs/ablation).
    return TinyModelSpec(default_spec(seed), single_episodes=0, version=7, family="single_digit_sum",
                         answer_accuracy=1.0, wrong_answers=[0, 18], worked=True,
                         warmup_seed_base=LEARNING_WARMUP_SEED_BASE, debates=400, phrase_tokens=True, vocab_size=2048,
                         sft_steps=300, sft_schedule_steps=600)


def sums_spec(seed: int = 0) -> TinyModelSpec:
    """The tiny model of the honest learning protocol (``model: tiny-sums``, recipe version 2): the
    default size and phrase-token tokenizer of :func:`learning_spec`, warmed up on episodes of
    ``two_digit_sum`` (8,100 problems split by content: warm-up, RL, validation and held-out
    problems never share a problem; :mod:`env_server.debate.problems.splits`), drawn from the
    warm-up split only. Its committed build is the protocol's starting policy
    (:data:`PINNED_DIR`).

    What the warm-up puts in (:func:`~trainer_client.tiny_models.warmup_debates.synthetic_debates`):

    - the solver works every sum column by column and, on a problem whose ones column carries,
      keeps the carry with probability ``answer_accuracy`` (0.3): its greedy answer forgets the
      carry, its samples keep it now and then (the skill RL can find: pass@k above greedy);
    - a verifier with skill: it works the sum itself in words of its own and keeps the carry with
      probability ``verifier_accuracy`` (0.7), then says CORRECT exactly when its sum is the
      solution's answer;
    - a judge that concludes from the debate: the solution's answer on CORRECT, the verifier's
      sum on INCORRECT;
    - the single-agent prompt (``single_episodes``, RFC 0006), so single and debate training
      share the start;
    - hint-following examples on ``hint_fraction`` of the solver turns that would slip: the
      server's localised hint for the slipped answer ("its tens digit is wrong"), then the turn's
      instructions restated (as ``sdpo.restate`` lays out hint distillation's teacher), then the
      right working.

    Stop rule: 12,000 steps of a linear decay to zero, fixed on validation problems before any RL
    run. It does **not** end on a plateau: the greedy validation curve
    (``docs/ablation/start/warmup-curve.json``, 100 problems) reads 11/20/25/35/40/56% at steps
    7k-12k, still rising towards the recipe's ceiling (greedy is right where the ones column does
    not carry: 65% of those 100 problems, 59% of the protocol's 200). So a rebuild on another
    thread count or CPU may land elsewhere; the protocol uses the committed build, which loads the
    same everywhere. Version 1 (:func:`sums_spec_v1`) stopped mid-rise too: rebuilt, it landed at
    7.5% with 1 torch thread, 21.5% with 2 and 44% on another CPU."""
    from env_server.debate.problems.splits import WARMUP_SEED_BASE

    return TinyModelSpec(default_spec(seed), single_episodes=600, version=2, family="two_digit_sum",
                         answer_accuracy=0.3, wrong_answers="carry", worked=True, verifier="worked",
                         verifier_accuracy=0.7, judge="verdict", hint_fraction=0.15, hint_roles=["solver"],
                         hint_style="localised", restate_hints=True, warmup_seed_base=WARMUP_SEED_BASE, debates=3000,
                         phrase_tokens=True, vocab_size=2048, sft_steps=12000, sft_schedule_steps=12000)


def division_spec(seed: int = 0) -> TinyModelSpec:
    """The tiny model of the family where checking is cheaper than solving (``model: tiny-div``,
    recipe version 2; issue 54): ``tiny-sums``'s size, tokenizer and warm-up layout on
    ``exact_division`` (720 problems ``(q·d) ÷ d`` split by content; the warm-up draws its 282),
    with each role's skill its own (:class:`~trainer_client.tiny_models.warmup_debates.DivisionWorking`):

    - the solver works the long division and, where the tens step leaves a remainder, keeps it
      with probability ``answer_accuracy`` (0.3): its greedy answer drops it, its samples keep
      it now and then (pass@k above greedy, as for the sums' carry);
    - the verifier checks by multiplying the answer back and keeps the ones product's carry with
      probability ``verifier_accuracy`` (0.3): greedy, a right answer whose check carries is
      rejected, which RL can fix; a wrong answer's product is never the dividend, so it is
      always rejected. After a failed check it redoes the division (remainder kept at 0.3);
    - the judge concludes from the debate (the solver's answer on CORRECT, the verifier's redo
      on INCORRECT); hint-following solver turns on 15% of the turns that would slip;
    - version 2: ``fact_drills`` (1,200) short drills of the division table beside the 3,600
      episodes (:func:`~trainer_client.tiny_models.warmup_debates.division_fact_drills`, 8 facts
      each, trained on the answer digits only). Version 1 had none and its greedy solver was
      right on 2.5% of 118 validation problems (``docs/ablation/debate/division-family.md``):
      the 282 warm-up problems show 254 of the 476 facts, and the 2-layer model did not carry
      out the division on new problems even from facts it had seen. 8,000 steps (version 1:
      12,000, flat from 2,000 on).

    Stop rule: not yet fixed on validation; the generator-verifier gap is measured on this build
    before the family is chosen."""
    from env_server.debate.problems.splits import WARMUP_SEED_BASE

    return TinyModelSpec(default_spec(seed), single_episodes=600, version=2, family="exact_division",
                         answer_accuracy=0.3, wrong_answers="carry", worked=True, verifier="worked",
                         verifier_accuracy=0.3, judge="verdict", hint_fraction=0.15, hint_roles=["solver"],
                         hint_style="localised", restate_hints=True, warmup_seed_base=WARMUP_SEED_BASE, debates=3000,
                         fact_drills=1200, phrase_tokens=True, vocab_size=2048, sft_steps=8000,
                         sft_schedule_steps=8000)


def division_rounds_spec(seed: int = 0) -> TinyModelSpec:
    """``tiny-div`` warmed up on two-round debates (``model: tiny-div-r2``; issue 54's last lever,
    a team-plus-local reward on the solver's revision turns, needs a start that has seen a
    revision): :func:`division_spec` with the warm-up's debates played with ``max_rounds=2``
    (:func:`~trainer_client.tiny_models.warmup_debates.synthetic_debates`). The debate's order is
    the server's: a verifier that accepts the first answer ends the round and the judge closes;
    one that rejects it sends it back, the solver revises (the scripted revision works the
    division again, keeping the remainder with the same probability 0.3, drawn anew), the
    verifier checks the revision and the judge concludes from that last verdict. The single-mode
    episodes, the drills, the problems, the seeds and the 8,000 steps are ``tiny-div``'s.

    Stop rule: the same length as ``tiny-div`` (no choice made on this build's curve)."""
    return TinyModelSpec(division_spec(seed), max_rounds=2)


def sums_spec_v1(seed: int = 0) -> TinyModelSpec:
    """Version 1 of ``tiny-sums`` (the start of the published factorial, docs/ablation/factorial;
    build hash 966aa285f8b3ae83 for seed 0), kept to rebuild and to compare: the unhinted solver
    right with probability 0.7 (a wrong answer a carry or last-digit slip of the right one, in a
    one-word lead-in, not worked), the verifier a coin flip, the judge copying the last answer,
    hint templates on 25% of the turns, 1,000 steps. Its stop rule fell on the steep part of the
    warm-up curve: rebuilt on another machine or thread count it lands anywhere from 7.5% to 44%."""
    from env_server.debate.problems.splits import WARMUP_SEED_BASE

    return TinyModelSpec(default_spec(seed), single_episodes=0, version=1, family="two_digit_sum",
                         answer_accuracy=0.7, wrong_answers="near", worked=True, hint_fraction=0.25,
                         warmup_seed_base=WARMUP_SEED_BASE, debates=1600, phrase_tokens=True, vocab_size=2048,
                         sft_steps=1000, sft_schedule_steps=1000)



def tiny_model_spec(name: str) -> TinyModelSpec:
    """The spec of the tiny model ``name`` (a key of ``TINY_MODELS`` or ``<key>@<seed>``).

    Raises:
        KeyError: an unknown name.
        ValueError: a seed that is not an integer.
    """
    from trainer_client.config import TINY_MODELS

    key, _, seed = name.partition("@")
    return teacher_spec(key, int(seed)) if seed else globals()[TINY_MODELS[key]]()


#: How much longer a default teacher's warm-up runs than its policy's: the tiny recipes stop
#: mid-rise, where another seed lands anywhere on the curve (``tiny-sums`` version 1's teachers at
#: the policy's length: 5%, 1% and 12% greedy against the policy's 44%; version 2's ``tiny-sums@1``
#: at the policy's 12,000 steps: 4% on 100 validation problems against the policy's 56%).
TEACHER_WARMUP_FACTOR = 1.5
#: What a tiny model's default teachers change in their policy's recipe besides the seed and the
#: length: ``tiny-sums``'s teachers keep the carry 80% of the time where the policy's solver keeps
#: it 30% (a teacher worth learning from is better than the policy at what the policy gets wrong).
TEACHER_OVERRIDES: dict[str, dict[str, Any]] = {"tiny-sums": {"answer_accuracy": 0.8}}


def teacher_spec(key: str, seed: int) -> TinyModelSpec:
    """The spec of the tiny model ``<key>@<seed>``, a default trace-replay teacher
    (:func:`trainer_client.config.tiny_model_teachers`): the recipe of ``key`` with another seed,
    :data:`TEACHER_OVERRIDES` of ``key`` where it has some, and a warm-up
    :data:`TEACHER_WARMUP_FACTOR` times as long (steps and schedule)."""
    from trainer_client.config import TINY_MODELS

    spec = TinyModelSpec(globals()[TINY_MODELS[key]](seed), **TEACHER_OVERRIDES.get(key, {}))
    steps = int(spec["sft_steps"] * TEACHER_WARMUP_FACTOR)
    return TinyModelSpec(spec, sft_steps=steps,
                         sft_schedule_steps=int(spec.get("sft_schedule_steps", spec["sft_steps"]) * TEACHER_WARMUP_FACTOR))


def is_tiny_model_name(name: str | None) -> bool:
    """Whether ``name`` names an offline tiny model (a ``TINY_MODELS`` key, or ``<key>@<seed>``)."""
    from trainer_client.config import TINY_MODELS

    key, _, seed = (name or "").partition("@")
    return key in TINY_MODELS and (not seed or seed.isdigit())
