"""benchmarks.layer_chains: each decoder layer's kernel chain against its floor (the attention
issue's whole-layer target), and the per-layer floors benchmarks.decode writes for it."""
import json

import pytest
import torch

from benchmarks.decode import Floor
from benchmarks.layer_chains import TARGET_X_FLOOR, class_rows, kernel_rows, layer_rows, main, split_layers, summary_line
from lingc.models import Ling3Cache, build_model, preset


def k(name, us):
    return {"kernel": name, "grid": [1, 1, 1], "critical_us": us, "us": us}


# Two target layers as a verify graph records them: a KDA layer with a dense MLP, an MLA layer
# with a MoE; ATen glue first, then the lm_head, the verdict and the KDA commit after the last.
KDA_DENSE = [k("_rmsnorm_kernel", 2.0), k("_gemm_kernel", 10.0), k("_kda_chain_kernel", 9.0),
             k("_gated_head_rmsnorm_kernel", 1.0), k("_gemm_kernel", 4.0), k("_rmsnorm_kernel", 1.0),
             k("_swiglu_gemm_prefetch_kernel", 6.0), k("_gemm_kernel", 5.0)]
MLA_MOE = [k("_rmsnorm_kernel", 1.0), k("_gemm_kernel", 8.0), k("_mla_split_kernel", 30.0),
           k("_mla_combine_kernel", 3.0), k("_head_matmul_kernel", 2.0), k("_gemm_kernel", 3.0),
           k("_rmsnorm_kernel", 1.0), k("_moe_router_logits_kernel", 2.0), k("_moe_router_select_kernel", 3.0),
           k("_moe_align_kernel", 3.0), k("_moe_up_kernel", 29.0), k("_moe_down_kernel", 16.0)]
HEAD = [k("void at::native::elementwise_kernel<128, 2>", 4.0)]
TAIL = [k("_gemm_argmax_kernel", 50.0), k("_greedy_verdict_kernel", 2.0), k("_rmsnorm_kernel", 1.0),
        k("_kda_commit_many_kernel", 2.0)]
SEQ = HEAD + KDA_DENSE + MLA_MOE + TAIL


def test_layers_end_at_their_mlp_and_the_rest_is_outside():
    layers, outside = split_layers(SEQ)
    assert [[x["kernel"] for x in seg] for seg in layers] == [[x["kernel"] for x in KDA_DENSE],
                                                              [x["kernel"] for x in MLA_MOE]]
    # ATen glue, the lm_head and verdict anywhere, and whatever follows the last layer.
    assert [x["kernel"] for x in outside] == [HEAD[0]["kernel"], "_gemm_argmax_kernel", "_greedy_verdict_kernel",
                                              "_rmsnorm_kernel", "_kda_commit_many_kernel"]
    # A draft graph's lm_head between two draft layers does not join either.
    draft = MLA_MOE + [k("_gemm_argmax_kernel", 50.0), k("void at::native::CatArrayBatchedCopy", 1.5)] + MLA_MOE
    layers, outside = split_layers(draft)
    assert len(layers) == 2 and all(len(seg) == len(MLA_MOE) for seg in layers) and len(outside) == 2


def test_layer_rows_set_each_chain_beside_its_floor_and_classes_judge_the_worst():
    floors = [("KDA + dense MLP", 30.0), ("MLA + MoE", 50.0)]
    rows = layer_rows(SEQ, floors)
    assert [(r["class"], r["kernels"], r["us"], r["floor_us"]) for r in rows] == [
        ("KDA + dense MLP", 8, 38.0, 30.0), ("MLA + MoE", 12, 101.0, 50.0)]
    assert rows[0]["x_floor"] == pytest.approx(38 / 30)
    classes = class_rows(rows + [dict(rows[0], layer=2, us=33.0, x_floor=1.1)])
    kda = classes[0]
    assert (kda["layers"], kda["us"], kda["worst"], kda["target"]) == (2, 35.5, pytest.approx(38 / 30), "met")
    assert 38 / 30 <= TARGET_X_FLOOR and classes[1]["target"] == "missed"
    line = summary_line(SEQ, floors)
    assert "KDA + dense MLP x1: 38.0 / 30.0 us = 1.27x" in line and "outside the layers 59 us" in line
    # A floor list that does not match the cut is said so, not paired by guesswork.
    assert "2 layer segments in the sequence against 3 layers" in layer_rows(SEQ, floors + floors[:1])


def test_cli_tables_a_decode_json_and_names_what_is_missing(tmp_path, capsys):
    path = tmp_path / "decode.json"
    floors = [["KDA + dense MLP", 30.0], ["MLA + MoE", 50.0]]
    path.write_text(json.dumps({"results": {"lingc-nextn": {"kernel_sequence": {"verify": SEQ},
                                                            "layer_floor_us": {"verify": floors}}}}))
    assert main([str(path), "--mode", "lingc-nextn", "--graph", "verify"]) == 0
    out = capsys.readouterr().out
    assert "| MLA + MoE | 1 | 12 | 101.0 | 50.0 | 2.02 | 2.02 | missed |" in out
    assert "outside the layers: 59.0 us in 5 kernels" in out
    assert main([str(path), "--mode", "lingc-nextn", "--graph", "verify", "--layers"]) == 0
    assert "| 1 | MLA + MoE | 12 | 101.0 | 50.0 | 2.02 |" in capsys.readouterr().out
    path.write_text(json.dumps({"results": {"lingc": {"kernel_sequence": {"decode": SEQ}}}}))
    with pytest.raises(SystemExit, match="no layer floors for graph 'decode'"):
        main([str(path)])
    with pytest.raises(SystemExit, match="no kernel sequence for graph 'verify'"):
        main([str(path), "--graph", "verify"])


def test_class_table_sets_the_chain_bound_beside_each_class(tmp_path, capsys):
    """floor + kernels x one boundary per layer, and what the chain takes beyond it."""
    floors = [("KDA + dense MLP", 30.0), ("MLA + MoE", 50.0)]
    kda, mla = class_rows(layer_rows(SEQ, floors), boundary_us=1.0)
    assert (kda["bound_us"], kda["beyond_us"]) == (38.0, 0.0)          # 30 + 8 x 1; 38 - 38
    assert (mla["bound_us"], mla["beyond_us"]) == (62.0, 39.0)         # 50 + 12 x 1; 101 - 62
    assert "bound_us" not in class_rows(layer_rows(SEQ, floors))[0]
    path = tmp_path / "decode.json"
    doc = {"results": {"lingc": {"kernel_sequence": {"decode": SEQ}, "layer_floor_us": {"decode": floors}}}}
    path.write_text(json.dumps({**doc, "pdl_boundary_us": 0.5}))
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "each layer's floor + its kernels x 0.50 us" in out
    assert "| MLA + MoE | 1 | 12 | 101.0 | 50.0 | 2.02 | 2.02 | missed | 56.0 | 45.0 |" in out
    assert main([str(path), "--boundary-us", "1"]) == 0                # the option wins over the JSON
    assert "| 62.0 | 39.0 |" in capsys.readouterr().out
    path.write_text(json.dumps(doc))                                   # an older JSON: no bound columns
    assert main([str(path)]) == 0
    assert "chain bound" not in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--boundary-us -1.0: a boundary's cost cannot be negative"):
        main([str(path), "--boundary-us", "-1"])


@pytest.mark.parametrize("T", [1, 6])
def test_layer_floors_sum_to_the_step_floor(T):
    # The per-layer bytes of a target forward plus the final norm and lm_head are Floor.bytes, with
    # a KDA layer's staged states at T > 1; the draft layer's plus the lm_head are the draft's.
    cfg = preset("tiny")
    model = build_model(cfg, progress=False)
    cache = Ling3Cache.allocate(cfg, 64)
    floor = Floor(model, 48)
    ids, pos = torch.arange(3, 3 + T), torch.arange(48, 48 + T)
    ex = floor.experts_per_layer(lambda: model(ids, pos, cache))
    assert len(ex) == sum(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers)) and all(e > 0 for e in ex)
    per = floor.layer_bytes(T, ex)
    assert len(per) == cfg.num_hidden_layers
    assert {label for label, _ in per} >= {"KDA + MoE", "MLA + MoE"}
    outside = sum(p.numel() * p.element_size() for m in (model.model.norm, model.lm_head) for p in m.parameters())
    assert sum(b for _, b in per) + outside == floor.bytes(T, [], sum(ex))
    # A verify chain stages T post-states per KDA layer; an MLA layer reads the same cache rows.
    staged = [b - b1 for (_, b), (_, b1) in zip(per, floor.layer_bytes(1, ex))]
    state = cfg.num_attention_heads * cfg.head_dim ** 2 * 4
    assert staged == [(T * state if T > 1 and i in cfg.kda_layers else 0) for i in range(cfg.num_hidden_layers)]
    h = torch.randn(T, cfg.hidden_size)
    exd = floor.experts_per_layer(lambda: model.draft(ids, pos, h, cache))
    (label, b), = floor.layer_bytes(T, exd, draft=True)
    lm = sum(p.numel() * p.element_size() for p in model.lm_head.parameters())
    assert label == "draft (NEXTN) layer" and b + lm == floor.bytes(None, [T], sum(exd))
    with pytest.raises(ValueError, match="1 expert counts for"):
        floor.layer_bytes(T, ex[:1])


def test_kernel_rows_table_one_class_position_by_position(tmp_path, capsys):
    # Two MLA + MoE layers (the second 1 us slower in its up-GEMM) and a KDA layer between them.
    slow = [dict(x, critical_us=x["critical_us"] + 1.0) if x["kernel"] == "_moe_up_kernel" else x for x in MLA_MOE]
    seq = MLA_MOE + KDA_DENSE + slow + TAIL
    floors = [("MLA + MoE", 50.0), ("KDA + dense MLP", 30.0), ("MLA + MoE", 52.0)]
    rows = kernel_rows(seq, floors, "MLA + MoE")
    assert [r["kernel"] for r in rows] == [x["kernel"] for x in MLA_MOE]
    up = rows[[x["kernel"] for x in MLA_MOE].index("_moe_up_kernel")]
    assert (up["us"], up["max_us"]) == (29.5, 30.0) and up["share"] == pytest.approx(29.5 / 101.5)
    assert "no layer of class 'MLA'" in kernel_rows(seq, floors, "MLA")
    odd = MLA_MOE + KDA_DENSE + MLA_MOE[:1] + MLA_MOE + TAIL[:1]
    assert "do not all run the same kernel chain" in kernel_rows(
        odd, [("MLA + MoE", 1.0), ("KDA + dense MLP", 1.0), ("MLA + MoE", 1.0)], "MLA + MoE")
    path = tmp_path / "decode.json"
    path.write_text(json.dumps({"results": {"lingc": {"kernel_sequence": {"decode": seq},
                                                      "layer_floor_us": {"decode": [list(f) for f in floors]}}}}))
    assert main([str(path), "--kernels", "MLA + MoE"]) == 0
    out = capsys.readouterr().out
    assert "a MLA + MoE layer kernel by kernel (floor 51.0 us per layer, median)" in out
    assert "| 10 | _moe_up_kernel | 1x1x1 | 29.50 | 30.00 | 29% |" in out
    with pytest.raises(SystemExit, match="no layer of class 'dense'"):
        main([str(path), "--kernels", "dense"])
