"""The training loss: cross-entropy in fp32 over the logits' real columns, whole or chunk by chunk.

``full``: the whole logits tensor upcast to fp32, then cross-entropy (autograd keeps the fp32
log-softmax for backward). ``chunked``: fp32 one chunk of rows at a time; the loss and its gradient
(softmax minus one-hot, over the rows) are computed together in forward, and the gradient is kept in
the logits' own dtype, so no fp32 copy of the whole logits ever exists (Liger-Kernel's and llm.c's
approach, without fusing the output projection). Both equal the fp32 loss to rounding.

Columns past ``vocab`` (a padded vocabulary, model.vocab_multiple) take no part: they are never
targets, and they are left out of the softmax, so padding changes no loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from contract.tuning import chunk_rows


def loss_fn(logits: torch.Tensor, targets: torch.Tensor, *, vocab: int | None = None,
            chunked: bool = False) -> torch.Tensor:
    """Mean cross-entropy of ``logits`` [..., width] against ``targets`` [...], over the first ``vocab``
    columns (all when None)."""
    flat = logits.flatten(0, -2)
    width = flat.shape[-1] if vocab is None else min(vocab, flat.shape[-1])
    if chunked:
        # The whole width goes in: the gradient is written in place, padded columns zero, with no
        # slice whose backward would allocate and copy a logits-sized tensor.
        return _ChunkedCrossEntropy.apply(flat, targets.flatten(), chunk_rows(width), width)
    if width < flat.shape[-1]:
        flat = flat[:, :width]
    # fp32 whatever the compute dtype: a bf16 softmax over a 50k vocabulary loses digits.
    # A padded vocabulary's slice is strided: made contiguous once (log-softmax's strided path is slow).
    return F.cross_entropy(flat.float().contiguous(), targets.flatten())


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy whose gradient is computed in forward, chunk by chunk, in the logits' dtype."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, rows: int, width: int) -> torch.Tensor:
        n = logits.shape[0]
        grad = None
        if logits.requires_grad:
            grad = torch.empty_like(logits)
            grad[:, width:] = 0  # padded columns: in no softmax, no gradient
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for start in range(0, n, rows):
            chunk = logits[start : start + rows, :width].float()
            target = targets[start : start + rows]
            log_probs = torch.log_softmax(chunk, dim=-1)
            total = total - log_probs.gather(1, target[:, None]).sum()
            if grad is not None:
                probs = log_probs.exp_()  # in place: the chunk's only fp32 buffer besides `chunk`
                probs.scatter_add_(1, target[:, None], torch.full_like(probs[:, :1], -1.0))
                grad[start : start + rows, :width] = probs.div_(n)
        ctx.save_for_backward(grad)
        return total / n

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (grad,) = ctx.saved_tensors
        # In place: one backward per forward (no retain_graph here), and no second logits-sized tensor.
        return grad.mul_(grad_output.to(grad.dtype)), None, None, None
