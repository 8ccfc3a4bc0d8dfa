"""Does MLA's split kernel give the same bits with a 16-row and a 32-row query tile? Prints, per
context and chain length, whether `mla_decode_triton` at block_h 0 (the table's 16 rows) and 32
agree bitwise at flash-tp4-rank shapes (8 heads, rank 512, rope 64). If they did, the tile could
follow T without breaking batch invariance; the table keeps it a shape constant either way."""
import dataclasses

import torch

from lingc.models.layers import rope_inv_freq
from lingc.runtime.kernels.mla_decode.kernel import config_for, mla_decode_triton

for L in (8192, 65536):
    gen = torch.Generator(device="cuda").manual_seed(L)
    kv = torch.randn(L, 576, generator=gen, device="cuda").to(torch.bfloat16)
    freq = rope_inv_freq(64, 6.0e6).cuda()
    for T in (1, 2, 6, 8):
        ql = torch.randn(T, 8, 512, generator=gen, device="cuda") * 0.05
        qr = torch.randn(T, 8, 64, generator=gen, device="cuda").to(torch.bfloat16)
        gate = torch.randn(T, 8, generator=gen, device="cuda").to(torch.bfloat16)
        pos = torch.arange(L - T, L, device="cuda")
        outs = [mla_decode_triton(ql, qr, kv, pos, 0.1, gate, freq,
                                  config=dataclasses.replace(config_for(L, 8, 512, 64), block_h=b)) for b in (0, 32)]
        same = torch.equal(*outs)
        diff = (outs[0] - outs[1]).abs().max().item()
        print(f"L={L} T={T}: block_h 16 vs 32 bitwise equal: {same} (max abs diff {diff:.3e})", flush=True)
