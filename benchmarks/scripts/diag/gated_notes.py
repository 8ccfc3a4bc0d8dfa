"""Session 53's device diagnosis: pdl_swap's notes for the bf16 gated-attention foreign model on
CUDA (why its attention was left), and the final graph of the attention layer alone."""
import sys, torch
sys.path.insert(0, "tests")
import test_foreign_model as t
m, groups = t._gated(torch.bfloat16, "cuda")
T = 6
ids, pos = torch.arange(11, 11 + T, device="cuda"), torch.arange(10, 10 + T, device="cuda")
out, ref, report, ref_groups = t._eager_then_lingc(m, ids, pos, groups)
for s in report.stats:
    if s.name == "pdl_swap":
        for n in s.notes:
            print("NOTE", n[:600])
import tempfile, torch._dynamo
from backend_helpers import run_and_report, final_graph_text
torch._dynamo.reset()
m2 = t.fm.Qwen3NextStyleAttention(torch.Generator().manual_seed(0)).to("cuda", torch.bfloat16)
x = torch.randn(T, t.fm.HID, device="cuda").to(torch.bfloat16)
cache = torch.randn(24, 2, t.fm.KVH, t.fm.NOPE + t.fm.ROPE, device="cuda").to(torch.bfloat16)
d = tempfile.mkdtemp()
_, rep = run_and_report(m2, x, pos, cache, dump_dir=d)
import pathlib
print("GRAPH", (pathlib.Path(d) / "00-input.txt").read_text() if (pathlib.Path(d) / "00-input.txt").exists() else sorted(p.name for p in pathlib.Path(d).iterdir()))
print("FINAL", final_graph_text(rep))
