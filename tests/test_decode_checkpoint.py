"""benchmarks.decode on a checkpoint's weights and a real prompt (`--checkpoint`,
`--prompt-ids-file`): the lingc modes decode after the engine's own prefill of the prompt, so the
relay's accept length is measured; and the errors for clashing or broken inputs. CPU, tiny."""
import json

import pytest
import torch
from test_benchmark_smoke import run

from lingc.decoding.reference import greedy_generate
from model_helpers import tiny_model

PROMPT = [5, 17, 2, 99, 41, 8, 63, 12, 7, 150, 3]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    tiny_model(seed=4).save_pretrained(path)
    return path


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "relay"])
def test_run_lingc_continues_after_the_prompts_prefill(monkeypatch, speculative):
    # The tokens a lingc run reports continue the prompt exactly as eager greedy decoding does
    # (tiny, fp32: lingc's ops run their references on the CPU); the prefill's own first token
    # is not among them.
    from benchmarks import decode

    monkeypatch.setattr(decode, "DEV", "cpu")
    model = tiny_model(seed=4)
    res = decode.run_lingc(model, len(PROMPT), 6, speculative, 0, progress=False, steps=3, max_steps=3,
                           start=decode.prompt_start(PROMPT))
    with torch.no_grad():
        eager = greedy_generate(model, PROMPT, 7, eos_token_id=None)
    assert res["tokens"] == eager[1:1 + len(res["tokens"])] and len(res["tokens"]) >= 6


def test_decode_benchmark_on_a_checkpoint_and_a_prompt_file(checkpoint, tmp_path):
    ids = tmp_path / "prompt.txt"
    ids.write_text(" ".join(map(str, PROMPT[:6])) + ",\n" + ",".join(map(str, PROMPT[6:])))
    out = run(["benchmarks.decode", "--smoke", "--checkpoint", str(checkpoint), "--prompt-ids-file", str(ids),
               "--modes", "lingc,lingc-nextn", "--steps", "3", "--tokens", "4"], tmp_path / "out", timeout=400)
    data = json.loads((tmp_path / "out" / "decode.json").read_text())
    assert data["preset"] == f"checkpoint {checkpoint.name}" and data["context"] == len(PROMPT)
    assert data["weights"] == f"checkpoint {checkpoint} (bf16)" and data["prompt_ids_file"] == str(ids)
    assert data["spec_equals_plain"] == {"lingc-nextn": True}
    assert f"checkpoint {checkpoint.name}, context {len(PROMPT)}" in out


@pytest.mark.parametrize("argv, message", [
    (["--preset", "tiny", "--checkpoint", "CKPT"], "give one of the two"),
    (["--checkpoint", "EMPTY"], r"--checkpoint: .*no config.json"),
    (["--prompt-ids-file", "MISSING"], r"--prompt-ids-file .*missing.txt: No such file"),
    (["--prompt-ids-file", "BAD"], "want token ids separated by commas or whitespace"),
    (["--prompt-ids-file", "BLANK"], "no token ids given"),
    (["--prompt-ids-file", "PROMPT", "--context", "64"], r"--context 64 and --prompt-ids-file .* \(11 ids\)"),
    (["--checkpoint", "CKPT", "--prompt-ids-file", "HUGE"], r"ids \[320, 1000\] are outside the vocabulary \[0, 320\)"),
])
def test_decode_benchmark_refuses_bad_inputs(checkpoint, tmp_path, argv, message):
    from benchmarks.decode import main

    files = {"MISSING": None, "BAD": "1 2 x", "BLANK": " \n", "PROMPT": " ".join(map(str, PROMPT)), "HUGE": "1 320 1000"}
    for name, text in files.items():
        if text is not None:
            (tmp_path / f"{name.lower()}.txt").write_text(text)
    subst = {"CKPT": str(checkpoint), "EMPTY": str(tmp_path), **{n: str(tmp_path / f"{n.lower()}.txt") for n in files}}
    with pytest.raises(SystemExit, match=message):
        main(["--smoke", "--modes", "lingc", "--out", str(tmp_path / "out"), *[subst.get(a, a) for a in argv]])
