"""Fused scaled-dot-product attention in a traced graph: which operand is which, where the output
is, and a CPU stand-in so that a region holding one can run in a probe.

``F.scaled_dot_product_attention`` reaches the functionalised ATen graph in the form its backend
choice takes at trace time, and that choice follows the inputs' device: on the CPU usually its math
decomposition (matmuls and ``_safe_softmax``, which the softmax matchers read) or
``_scaled_dot_product_flash_attention_for_cpu``; on CUDA one fused op, ``_scaled_dot_product_
{flash,efficient,cudnn}_attention`` (efficient is the one that takes a mask with unequal query and
value head dims, MLA's case). The fused ops return tuples: the output first, then the log-sum-exp
and the RNG state, so the output value is ``getitem(op, 0)``.

A pass that matches attention by running the cut-out region on random CPU tensors (pdl_swap's MLA
matcher, mla_absorb) cannot run the CUDA-only ops there; `CPU_STAND_INS` gives each a function of
the same signature that computes the output with the CPU's ``scaled_dot_product_attention`` (the
same math: is_causal is the top-left mask in every backend, a float bias is added to the scores).
``graph_region.region_module`` substitutes them.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F

aten = torch.ops.aten

# The CUDA-only fused forms (their CPU stand-ins below) and those that run on the CPU as they are.
CUDA_ONLY = (aten._scaled_dot_product_efficient_attention.default, aten._scaled_dot_product_flash_attention.default,
             aten._scaled_dot_product_cudnn_attention.default)
ON_CPU = (aten._scaled_dot_product_flash_attention_for_cpu.default, aten.scaled_dot_product_attention.default)
FUSED = CUDA_ONLY + ON_CPU

# The schema's name of the mask operand: a boolean mask or an additive float bias.
_MASK_NAMES = ("attn_mask", "attn_bias")


@dataclass
class SdpaCall:
    """One fused attention node with its operands named (``mask`` None when it has none;
    ``scale`` None means the default 1 / sqrt(query head dim))."""
    node: fx.Node
    out: fx.Node | None            # the value of the attention output: getitem(node, 0), or node itself
    q: fx.Node
    k: fx.Node
    v: fx.Node
    mask: fx.Node | None
    is_causal: bool
    scale: float | None
    dropout_p: float

    def effective_scale(self) -> float:
        if self.scale is not None:
            return float(self.scale)
        return 1.0 / math.sqrt(self.q.meta["val"].shape[-1])


def bind(target, args: tuple, kwargs: dict) -> dict:
    """The op's arguments by their schema names, defaults filled in."""
    out = {}
    for i, a in enumerate(target._schema.arguments):
        if i < len(args):
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        else:
            out[a.name] = a.default_value if a.has_default_value() else None
    return out


def _mask(a: dict):
    return next((a[k] for k in _MASK_NAMES if a.get(k) is not None), None)


def sdpa_call(n: fx.Node) -> SdpaCall | None:
    """n as a fused attention call, or None when it is not one."""
    if not (isinstance(n, fx.Node) and n.op == "call_function" and n.target in FUSED):
        return None
    a = bind(n.target, n.args, n.kwargs)
    mask = _mask(a)
    if n.target is aten.scaled_dot_product_attention.default:
        out = n
    else:
        outs = [u for u in n.users if u.op == "call_function" and u.target is operator.getitem and u.args[1] == 0]
        out = outs[0] if len(outs) == 1 else None
    return SdpaCall(n, out, a["query"], a["key"], a["value"], mask, bool(a.get("is_causal") or False),
                    a.get("scale"), float(a.get("dropout_p") or 0.0))


def _stand_in(target):
    n_out = len(target._schema.returns)

    def run(*args, **kwargs):
        a = bind(target, args, kwargs)
        # cuDNN's op takes GQA's fewer key / value heads as they are (SDPA with enable_gqa on an
        # H100 in bf16 traces to it): the CPU form must repeat them the same way.
        gqa = a["key"].dim() >= 3 and a["query"].shape[-3] != a["key"].shape[-3]
        out = F.scaled_dot_product_attention(a["query"], a["key"], a["value"], attn_mask=_mask(a),
                                             dropout_p=float(a.get("dropout_p") or 0.0),
                                             is_causal=bool(a.get("is_causal") or False), scale=a.get("scale"),
                                             enable_gqa=gqa)
        return (out,) + (None,) * (n_out - 1)

    run.__name__ = f"cpu_{target.__name__.split('.')[0]}"
    return run


CPU_STAND_INS = {t: _stand_in(t) for t in CUDA_ONLY}
