"""Reference of `lingc::relay_advance`: exactly the ops of the step functions' tails
(runtime/relay/steps.py, ``extend`` / ``decode`` then ``_ring_append``), in place."""

from __future__ import annotations

import torch


def relay_advance_reference(tokens, hidden, accept, emitted, n, x, seed, dh, ring, ring_k,
                            accepted: bool) -> None:
    if accepted:                                    # extend: the row of the accepted prefix's end
        a = accept
        if tokens is not None:                      # else the graph wrote the seed itself
            seed.copy_(tokens.gather(0, a))
        dh.copy_(hidden.index_select(0, a).view(dh.shape))
        x.copy_(emitted.gather(0, a))
        n.copy_(n + a + 1)
    else:                                           # decode: one token, emitted = [y, ...]
        emitted[:1].copy_(tokens)
        x.copy_(tokens)
        n.copy_(n + 1)
    row = torch.cat([emitted, accept]).unsqueeze(0)
    ring.index_copy_(0, ring_k % ring.shape[0], row)
    ring_k.add_(1)
