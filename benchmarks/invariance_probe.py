"""Which op breaks batch invariance? Position j of a compiled T-token chain must give the bits of
decoding positions 0..j one at a time (design.md); greedy speculative == greedy plain rests on it.

    python -m benchmarks.invariance_probe [--preset flash-tp4-rank] [--layers 6] [--t 6] [--context 32]

Compiles the model's forward with lingc at T=1 and at T=t (role "forward", ATen leftovers), runs
T=1 t times from a random cache and the t-token chain once from the same cache, recording the
output of every lingc op in each post-pass graph (torch.fx.Interpreter over the final graph).
The lingc ops of the two graphs are paired in order (the same ops per layer); for each pair the
row of position j (its axis: where the chain graph has t and the decode graph 1) is compared
bitwise. Prints the first pair that differs with its inputs' agreement (equal inputs + different
output = that op is not invariant), and the final hidden states' verdict. CUDA or CPU.
"""
from __future__ import annotations

import argparse

import torch
import torch.fx as fx

from lingc.models import Ling3Cache, build_model, preset


class _Recorder(fx.Interpreter):
    def __init__(self, gm):
        super().__init__(gm)
        self.seen: list[tuple[fx.Node, object, list]] = []

    def run_node(self, n):
        out = super().run_node(n)
        if n.op == "call_function" and getattr(n.target, "namespace", None) == "lingc":
            ins = [self.env[a] for a in n.all_input_nodes]
            self.seen.append((n, _clone(out), [_clone(x) for x in ins]))
        return out


def _clone(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, (list, tuple)):
        return [_clone(v) for v in x]
    return x


def _capture():
    """Patch lingc's graph compiler so every compiled graph runs through a _Recorder."""
    from lingc import backend

    graphs = []
    orig = backend.GraphCompiler.__call__

    def call(self, gm, example_inputs):
        orig(self, gm, example_inputs)
        entry = {"role": self.opts.role, "runs": []}
        graphs.append(entry)

        def run(args):
            rec = _Recorder(gm)
            out = rec.run(*args)
            entry["runs"].append(rec.seen)
            return out
        run._boxed_call = True
        return run

    backend.GraphCompiler.__call__ = call

    def restore():
        backend.GraphCompiler.__call__ = orig
    return graphs, restore


def _t_axis(a, b, t):
    """The axis where a (decode) is 1 and b (chain) is t, shapes otherwise equal."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dim() != b.dim():
        return None
    diff = [i for i, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y]
    if len(diff) == 1 and a.shape[diff[0]] == 1 and b.shape[diff[0]] == t:
        return diff[0]
    return None if not diff else -1


def _same(a, b, t, j):
    """Position j of chain value b equals decode value a (bitwise); None when not comparable."""
    if isinstance(a, list):
        res = [_same(x, y, t, j) for x, y in zip(a, b)]
        res = [r for r in res if r is not None]
        return all(res) if res else None
    ax = _t_axis(a, b, t)
    if ax == -1 or a is None or not isinstance(a, torch.Tensor):
        return None
    if ax is None:
        return bool(torch.equal(a, b)) if a.shape == b.shape else None
    return bool(torch.equal(a.select(ax, 0), b.select(ax, j)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="flash-tp4-rank")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--t", type=int, default=6)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--context", type=int, default=32, help="cache rows before the chain (random)")
    args = ap.parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = preset(args.preset, num_hidden_layers=args.layers, torch_dtype=args.dtype)
    model = build_model(cfg, device=dev, seed=0, progress=False)
    base = Ling3Cache.allocate(cfg, args.context + 2 * args.t, device=dev)
    gen = torch.Generator(device=dev).manual_seed(1)
    for x in base.tensors():
        x.copy_(0.3 * torch.randn(x.shape, generator=gen, device=dev, dtype=torch.float32))
    torch._dynamo.reset()          # graphs compiled before (another model object) would be reused
    graphs, restore = _capture()
    step = torch.compile(model, backend="lingc", fullgraph=True, dynamic=False,
                         options={"role": "forward", "inductor": False})
    t = args.t
    ids = torch.randint(0, cfg.vocab_size, (t,), generator=gen, device=dev)
    pos = torch.arange(args.context, args.context + t, device=dev)
    try:
        with torch.no_grad():
            seq_cache = base.clone()
            seq = [step(ids[j:j + 1], pos[j:j + 1], seq_cache) for j in range(t)]
            chain_cache = base.clone()
            chain = step(ids, pos, chain_cache)
    finally:
        restore()
    dec = next(g for g in graphs if len(g["runs"]) == t)["runs"]
    ch = next(g for g in graphs if len(g["runs"]) == 1)["runs"][0]
    name = lambda n: n.target._schema.name.split("::")[-1]  # noqa: E731
    print(f"{args.preset} x {args.layers} layers, {args.dtype}, {dev}: {len(ch)} lingc ops in the chain graph, "
          f"{len(dec[0])} in the decode graph")
    hidden_ok = all(torch.equal(seq[j][1][0], chain[1][j]) for j in range(t))
    logits_ok = all(torch.equal(seq[j][0][0], chain[0][j]) for j in range(t))
    print(f"final hidden rows equal bitwise: {hidden_ok}; logits rows: {logits_ok}; "
          f"logits finite: {bool(torch.isfinite(chain[0]).all())}, max |logit| {float(chain[0].float().abs().max()):.3g}")
    for j in range(t):
        for k, ((n1, o1, i1), (n6, o6, i6)) in enumerate(zip(dec[j], ch)):
            if name(n1) != name(n6):
                print(f"op lists diverge at #{k}: {name(n1)} vs {name(n6)}; stopping")
                return 1
            same = _same(o1, o6, t, j)
            if same is False:
                ins = [_same(a, b, t, j) for a, b in zip(i1, i6)]
                print(f"position {j}: first difference at lingc op #{k} {name(n6)} ({n6.name}); "
                      f"its inputs equal per position: {ins}")
                return 1
    print("every lingc op's rows agree")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
