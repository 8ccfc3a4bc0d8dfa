"""metadata_capture: per-step inputs refilled by the host become device ops on relay buffers.

A step function written the naive way reads its per-step metadata from input buffers that the
host refills before every launch: the chain positions (which also give the MLA cache write rows,
the causal mask and RoPE), the state slot and the relay's token inputs. Each such read is
spelled ``lingc.host_refill(host_buffer, device_value, what)``, where ``device_value`` is the same
quantity computed from GPU-resident relay values (e.g. ``relay.n + arange(T)``). Refilling from
the host needs the accept count on the host, i.e. a device->host sync every step, which is the
cost the source article removed (485 us per step).

Rewrite: every ``host_refill`` node is replaced by its ``device_value``, so the refill runs inside
the captured graph and the graph stops reading the host buffer. The runtime sees the matches in
the compile report and stops refilling (with the pass disabled it keeps the naive host refill,
and pays the sync). Exact: by contract both operands hold the same values.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from lingc.graph_build import eliminate_dead_code
from lingc.graph_match import is_call
from lingc.pass_manager import LingcPass
from lingc.runtime.relay import ops as _relay_ops  # noqa: F401  (registers torch.ops.lingc.host_refill etc.)


class MetadataCapture(LingcPass):
    """lingc.host_refill(host_buffer, device_value, what) -> device_value."""

    name = "metadata_capture"

    def apply(self, gm: fx.GraphModule) -> int:
        g = gm.graph
        nodes = [n for n in g.nodes if is_call(n, torch.ops.lingc.host_refill.default)]
        refilled = []
        for n in nodes:
            host, device_value, what = n.args
            n.replace_all_uses_with(device_value)
            g.erase_node(n)
            refilled.append(f"{what}, was {self.ctx.describe(host)}")
        if refilled:
            eliminate_dead_code(g)
            gm.recompile()
            unread = [self.ctx.describe(p) for p in g.nodes if p.op == "placeholder" and not p.users]
            self.notes += [f"computed on the device: {r}" for r in refilled]
            if unread:
                self.notes.append("inputs no longer read: " + ", ".join(unread))
        return len(nodes)


def graph_reads(gm: fx.GraphModule) -> list[str]:
    """Names of the placeholders the graph reads (for tests and the engine's refill decision)."""
    return [p.name for p in gm.graph.nodes if p.op == "placeholder" and p.users]
