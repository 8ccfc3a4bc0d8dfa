"""Launches MLA's split + combine at flash-tp4-rank shapes (context 8192, T = 1 then 6; fresh
random inputs) for Nsight Compute: `ncu --kernel-name _mla_split_kernel python3 THIS`."""
import torch

from lingc.models.layers import rope_inv_freq
from lingc.runtime.kernels.mla_decode.kernel import mla_decode_triton

L = 8192
gen = torch.Generator(device="cuda").manual_seed(0)
kv = torch.randn(L, 576, generator=gen, device="cuda").to(torch.bfloat16)
freq = rope_inv_freq(64, 6.0e6).cuda()
for T in (1, 6):
    ql = torch.randn(T, 8, 512, generator=gen, device="cuda") * 0.05
    qr = torch.randn(T, 8, 64, generator=gen, device="cuda").to(torch.bfloat16)
    gate = torch.randn(T, 8, generator=gen, device="cuda").to(torch.bfloat16)
    pos = torch.arange(L - T, L, device="cuda")
    for _ in range(2):      # the first launch compiles; ncu profiles the second of each T
        mla_decode_triton(ql, qr, kv, pos, 0.1, gate, freq, use_pdl=False)
torch.cuda.synchronize()
