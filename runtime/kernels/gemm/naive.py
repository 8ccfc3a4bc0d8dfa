"""Plain-PyTorch references for the decode GEMM and the fused GEMM + argmax.

``gemm_reference(x, weights, bias, residual, sigmoid_mul)``: ``x @ cat(weights).T`` with the
optional epilogues, in fp32, rounded once to ``x.dtype``:

    acc = x @ cat(weights).T (+ bias)                      fp32
    acc = sigmoid(acc) * sigmoid_mul   if sigmoid_mul      fp32
    acc = acc + residual               if residual         fp32
    out = acc.to(x.dtype)

The gate comes before the residual because that is how the two compose in a block
(``h + sigmoid(g) * o``); each is optional.

``gemm_argmax_reference(x, w)``: ``(ids, max_logit)`` of the logits ``gemm_reference(x, [w])``,
i.e. the logits rounded to ``x.dtype`` as the graph they replace would hold them, then
``torch.argmax`` over them: among equal maxima the lowest index wins, and NaN counts as larger
than any number (the first NaN wins). ``max_logit`` is the fp32 value of the logit at the
returned id.

Both are batch-invariant like the kernels (design.md): each row goes through its own
[1, K] x [K, N] product, so a row's bits do not depend on how many rows run with it. They are
the ops' CPU implementations.
"""
import torch
import torch.nn.functional as F

__all__ = ["gemm_epilogue", "gemm_reference", "gemm_argmax_reference"]


def gemm_epilogue(
    acc: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    sigmoid_mul: torch.Tensor | None = None,
) -> torch.Tensor:
    """The epilogue on fp32 accumulators [M, N] (module docstring); returns fp32."""
    if bias is not None:
        acc = acc + bias.float()
    if sigmoid_mul is not None:
        acc = torch.sigmoid(acc) * sigmoid_mul.float()
    if residual is not None:
        acc = acc + residual.float()
    return acc


def _rowwise_linear(x: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
    """fp32 [M, sum N] = x @ cat(weights).T, one row and one weight at a time (no weight copy;
    a single [M, K] product may pick an M-dependent blocking, which would break invariance)."""
    xf = x.float()
    wf = [w.float() for w in weights]
    n = sum(w.shape[0] for w in weights)
    rows = [torch.cat([F.linear(xf[i : i + 1], w) for w in wf], dim=1) for i in range(xf.shape[0])]
    return torch.cat(rows) if rows else xf.new_empty(0, n)


def gemm_reference(
    x: torch.Tensor,
    weights: list[torch.Tensor],
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    sigmoid_mul: torch.Tensor | None = None,
) -> torch.Tensor:
    """out [M, sum N] in x.dtype (module docstring)."""
    return gemm_epilogue(_rowwise_linear(x, weights), bias, residual, sigmoid_mul).to(x.dtype)


def gemm_argmax_reference(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids int64 [M], max_logit fp32 [M]) of the logits x @ w.T rounded to x.dtype."""
    logits = gemm_reference(x, [w]).float()
    ids = torch.argmax(logits, dim=1)
    return ids, logits.gather(1, ids[:, None])[:, 0]
