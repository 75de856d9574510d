"""``chunked_logps`` against autograd through the full logits (``selective_log_softmax``)."""

from __future__ import annotations

import pytest
import torch
from trl.trainer.utils import selective_log_softmax

from trainer_client.model.chunked_logps import chunked_logps


@pytest.mark.parametrize("block_elements", [10_000, 2_500, 1], ids=["one-block", "rows-of-five", "row-at-a-time"])
def test_chunked_logps_equal_the_full_logits_ones_and_their_gradients(block_elements: int) -> None:
    torch.manual_seed(3)
    hidden, weight = torch.randn(13, 16), torch.randn(500, 16) * 0.5
    targets = torch.randint(0, 500, (13,))
    upstream = torch.linspace(-2.0, 1.5, 13)  # a different gradient for every row, as DPO's pairs send

    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    ours = chunked_logps(h, w, targets, block_elements)
    (ours * upstream).sum().backward()
    h_full, w_full = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    full = selective_log_softmax(h_full @ w_full.T, targets)
    (full * upstream).sum().backward()

    torch.testing.assert_close(ours, full.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(h.grad, h_full.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(w.grad, w_full.grad, rtol=1e-4, atol=1e-6)


def test_chunked_logps_without_rows_and_with_mismatched_shapes() -> None:
    weight = torch.randn(7, 4, requires_grad=True)
    empty = chunked_logps(torch.zeros(0, 4, requires_grad=True), weight, torch.zeros(0, dtype=torch.long), 100)
    assert empty.shape == (0,)
    empty.sum().backward()
    with pytest.raises(ValueError, match=r"need \(N, H\), \(V, H\) and \(N,\)"):
        chunked_logps(torch.zeros(2, 4), weight, torch.zeros(3, dtype=torch.long), 100)
