"""The chunked loss channels give the losses of the full-logits code they replaced (issue 42).

The expected numbers below were produced by the code before the change (commit 2195426:
hint distillation's JSD on ``(N, L, V)`` logits through ``masked_jsd_loss``, the DPO pairs'
log-probabilities through ``selective_log_softmax`` on full logits) on the stored batch these
helpers build with fixed seeds: hidden states and an output embedding for the JSD, a small Qwen3
whose weights are set from a seeded generator (not the library's initialisation, which may
change) and three pairs of random token ids for DPO. The chunked code must give the same values
to 1e-5, also when the blocks are made small enough that every loss spans many of them, and the
same gradients as the full-logits computation done here.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

import trainer_client.losses.functional as functional
import trainer_client.model.forward as forward
from trainer_client.losses.functional import chunked_jsd_loss, dpo_sigmoid_loss, masked_jsd_loss
from trainer_client.losses.pair_store import DpoPair
from trainer_client.losses.trace_replay import replay_pair_logps

#: (jsd_beta, temperature, token_clip) of each stored JSD value
JSD_CASES = [(0.5, 1.0, None), (0.0, 1.0, None), (1.0, 0.8, None), (0.3, 1.3, None), (0.5, 1.0, 0.35)]
#: produced by the full-logits code before the change (see the module docstring)
BEFORE = {
    "jsd": [0.38662394881248474, 2.599443197250366, 4.037978172302246, 0.2399817258119583, 0.33389005064964294],
    "chosen": [-38.10994338989258, -93.82990264892578, -8.80896282196045],
    "rejected": [-74.4686508178711, -23.702478408813477, -53.76759719848633],
    "chosen_rows": [-38.10994338989258, -93.82989501953125, -8.80896282196045],
    "rejected_rows": [-74.46865844726562, -23.702476501464844, -53.76759719848633],
    "dpo": 0.7835197448730469,
}


def jsd_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Student and teacher hidden states ``(3, 9, 32)``, an output embedding ``(1000, 32)`` and
    the erring tokens' mask (17 of the 27 positions)."""
    g = torch.Generator().manual_seed(42)
    student = torch.randn(3, 9, 32, generator=g)
    teacher = torch.randn(3, 9, 32, generator=g)
    weight = torch.randn(1000, 32, generator=g) * 0.3
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[0, :4] = False
    mask[2, :7] = False
    return student, teacher, weight, mask


def seeded_model() -> Qwen3ForCausalLM:
    config = Qwen3Config(vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, intermediate_size=64, max_position_embeddings=256,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else 0.2 * noise)
    return model.eval()


def seeded_pairs() -> list[DpoPair]:
    g = torch.Generator().manual_seed(3)

    def ids(n: int) -> list[int]:
        return torch.randint(10, 1000, (n,), generator=g).tolist()

    return [DpoPair(prompt_messages=[{"role": "user", "content": "q"}], chosen="c", rejected="r", episode_id=f"e{i}",
                    t=0, role="solver", teacher="oracle", created_step=0, context_ids=ids(c), chosen_ids=ids(a),
                    rejected_ids=ids(b))
            for i, (c, a, b) in enumerate([(17, 5, 9), (11, 12, 3), (23, 1, 7)])]


@pytest.fixture(params=[None, 3000], ids=["default-blocks", "small-blocks"])
def block(request, monkeypatch) -> int | None:
    """The default block size, and blocks of 3,000 logits (3 tokens of the JSD's vocabulary of
    1,000; vocabulary slices of a few hundred for the log-probabilities)."""
    if request.param is not None:
        monkeypatch.setattr(functional, "BLOCK_ELEMENTS", request.param)
        monkeypatch.setattr(forward, "BLOCK_ELEMENTS", request.param)
    return request.param


@pytest.mark.parametrize(("case", "expected"), list(zip(JSD_CASES, BEFORE["jsd"], strict=True)))
def test_chunked_jsd_gives_the_stored_loss_and_the_full_logits_gradients(block, case, expected) -> None:
    beta, temperature, clip = case
    student, teacher, weight, mask = jsd_inputs()
    s, w = student.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    chunked = chunked_jsd_loss(s[mask], teacher[mask], w, beta=beta, temperature=temperature, token_clip=clip)
    assert chunked.item() == pytest.approx(expected, abs=1e-5)
    chunked.backward()
    s_full, w_full = student.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    full = masked_jsd_loss(s_full @ w_full.T, teacher @ w_full.T.detach(), mask, beta=beta, temperature=temperature,
                           token_clip=clip)
    full.backward()
    assert full.item() == pytest.approx(expected, abs=1e-5)  # the reference path itself is unchanged
    torch.testing.assert_close(s.grad, s_full.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(w.grad, w_full.grad, rtol=1e-4, atol=1e-6)
    assert s.grad[~mask].abs().sum() == 0 and s.grad[mask].abs().sum() > 0


def test_chunked_jsd_with_the_teachers_own_head_is_the_hand_computed_divergence() -> None:
    """One token, a vocabulary of 2, hidden size 1: the student's head gives logits (0, 0), so
    ``p_S = (1/2, 1/2)``; the teacher's own head gives (ln 3, 0), so ``p_T = (3/4, 1/4)``. With
    ``m = (p_S + p_T)/2 = (5/8, 3/8)`` the JSD at β 0.5 is
    ``½·[¾ ln(6/5) + ¼ ln(2/3)] + ½·[½ ln(4/5) + ½ ln(4/3)] = 0.0338221`` nats; through the
    student's head for both sides it would be 0."""
    import math

    student, teacher = torch.ones(1, 1, requires_grad=True), torch.ones(1, 1)
    weight = torch.zeros(2, 1, requires_grad=True)
    teacher_weight = torch.tensor([[math.log(3.0)], [0.0]])
    by_hand = 0.5 * (0.75 * math.log(6 / 5) + 0.25 * math.log(2 / 3)) + 0.5 * (0.5 * math.log(4 / 5)
                                                                               + 0.5 * math.log(4 / 3))
    loss = chunked_jsd_loss(student, teacher, weight, teacher_weight=teacher_weight)
    assert loss.item() == pytest.approx(by_hand, abs=1e-7) and by_hand == pytest.approx(0.0338221, abs=1e-7)
    assert chunked_jsd_loss(student, teacher, weight).item() == pytest.approx(0.0, abs=1e-7)
    loss.backward()
    # d/dz of ½KL(S‖m): ½·p_S·(log p_S − log m − KL(S‖m)) per logit, times the hidden state 1
    kl_s = 0.5 * math.log(4 / 5) + 0.5 * math.log(4 / 3)
    expected = [0.5 * 0.5 * (math.log(0.5 / q) - kl_s) for q in (5 / 8, 3 / 8)]
    torch.testing.assert_close(weight.grad, torch.tensor([[expected[0]], [expected[1]]]), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(("beta", "temperature", "clip"), [(0.5, 1.0, None), (0.0, 1.0, None), (1.0, 0.8, None),
                                                           (0.5, 1.0, 0.35)])
def test_chunked_jsd_with_the_teachers_own_head_equals_the_full_logits_loss(block, beta, temperature, clip) -> None:
    """A ``base``/``ema`` teacher scores through its own head: the chunked loss with
    ``teacher_weight`` gives :func:`masked_jsd_loss` of the two heads' full logits, and its
    gradients for the student's hidden states and head; the teacher's head gets none."""
    student, teacher, weight, mask = jsd_inputs()
    teacher_weight = weight + 0.1 * torch.randn(weight.shape, generator=torch.Generator().manual_seed(5))
    s, w = student.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    w_t = teacher_weight.clone().requires_grad_(True)
    chunked = chunked_jsd_loss(s[mask], teacher[mask], w, beta=beta, temperature=temperature, token_clip=clip,
                               teacher_weight=w_t)
    chunked.backward()
    s_full, w_full = student.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    full = masked_jsd_loss(s_full @ w_full.T, teacher @ teacher_weight.T, mask, beta=beta, temperature=temperature,
                           token_clip=clip)
    full.backward()
    assert chunked.item() == pytest.approx(full.item(), abs=1e-5)
    assert chunked.item() != pytest.approx(chunked_jsd_loss(s[mask], teacher[mask], w, beta=beta,
                                                            temperature=temperature, token_clip=clip).item(), abs=1e-4)
    torch.testing.assert_close(s.grad, s_full.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(w.grad, w_full.grad, rtol=1e-4, atol=1e-6)
    assert w_t.grad is None


def test_chunked_jsd_checks_the_teachers_head_shape() -> None:
    with pytest.raises(ValueError, match=r"\(V, H_T\)"):
        chunked_jsd_loss(torch.zeros(2, 4), torch.zeros(2, 4), torch.zeros(10, 4), teacher_weight=torch.zeros(9, 4))


def test_chunked_jsd_without_rows_is_zero_and_checks_shapes() -> None:
    weight = torch.randn(10, 4, requires_grad=True)
    empty = chunked_jsd_loss(torch.zeros(0, 4, requires_grad=True), torch.zeros(0, 4), weight)
    assert empty.item() == 0.0
    empty.backward()
    with pytest.raises(ValueError, match=r"need \(N, H\)"):
        chunked_jsd_loss(torch.zeros(2, 4), torch.zeros(3, 4), weight)


@pytest.mark.parametrize("shared", [True, False], ids=["shared-context", "one-row-per-side"])
def test_dpo_pair_logps_and_loss_are_the_stored_ones(block, shared: bool) -> None:
    model = seeded_model()
    with torch.no_grad():
        chosen, rejected = replay_pair_logps(model, seeded_pairs(), pad_token_id=0, max_completion_length=16,
                                             device="cpu", shared_context=shared)
    suffix = "" if shared else "_rows"
    torch.testing.assert_close(chosen, torch.tensor(BEFORE["chosen" + suffix]), rtol=0, atol=1e-4)
    torch.testing.assert_close(rejected, torch.tensor(BEFORE["rejected" + suffix]), rtol=0, atol=1e-4)
    before_c, before_r = torch.tensor(BEFORE["chosen"]), torch.tensor(BEFORE["rejected"])
    ref_c, ref_r = before_c + torch.tensor([3.0, -1.0, 0.5]), before_r - torch.tensor([1.0, 2.0, -0.5])
    assert dpo_sigmoid_loss(chosen, rejected, ref_c, ref_r, 0.1).item() == pytest.approx(BEFORE["dpo"], abs=1e-5)


def test_dpo_gradients_equal_the_full_logits_ones(block) -> None:
    """The chunked log-probabilities' backward against autograd through the model's full logits."""
    from trl.trainer.utils import selective_log_softmax

    from trainer_client.model.forward import pack_responses

    pairs = seeded_pairs()
    contexts = [p.context_ids for p in pairs for _ in (0, 1)]
    responses = [r for p in pairs for r in (p.chosen_ids, p.rejected_ids)]
    ref_c, ref_r = torch.tensor([-40.0, -90.0, -9.0]), torch.tensor([-70.0, -25.0, -50.0])

    def grads(chunked: bool) -> tuple[float, dict[str, torch.Tensor]]:
        model = seeded_model()
        if chunked:
            chosen, rejected = replay_pair_logps(model, pairs, pad_token_id=0, max_completion_length=16, device="cpu")
        else:
            batch = pack_responses(contexts, responses, 0)
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                           position_ids=batch.position_ids).logits[:, -(batch.response_length + 1):-1]
            flat = (selective_log_softmax(logits, batch.labels) * batch.mask).sum(-1)
            chosen, rejected = flat[0::2], flat[1::2]
        loss = dpo_sigmoid_loss(chosen, rejected, ref_c, ref_r, 0.1)
        loss.backward()
        return loss.item(), {n: p.grad for n, p in model.named_parameters()}

    loss_chunked, chunked = grads(True)
    loss_full, full = grads(False)
    assert loss_chunked == pytest.approx(loss_full, abs=1e-6)
    for name, grad in full.items():
        torch.testing.assert_close(chunked[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert full["model.embed_tokens.weight"].abs().sum() > 0
