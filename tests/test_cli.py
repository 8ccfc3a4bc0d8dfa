"""`python -m lingc run|explain` on a checkpoint directory instead of a preset's random weights,
with the prompt given as token ids; and the errors for a clashing or broken source or prompt."""
import re

import pytest

from lingc.cli import main
from model_helpers import tiny_model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    tiny_model(seed=3).save_pretrained(path)
    return path


def test_run_from_a_checkpoint_with_given_prompt_ids(checkpoint, capsys):
    assert main(["run", "--checkpoint", str(checkpoint), "--prompt-ids", "3,1,4,1,5", "--new-tokens", "6",
                 "--steps", "3", "--device", "cpu", "--no-prefill-graphs"]) == 0
    out = capsys.readouterr().out
    assert f"lingc: loading checkpoint {checkpoint} on cpu" in out
    assert "prompt: 5 given tokens; 6 new tokens" in out
    assert out.count("tokens identical to eager") == 2 and "random weights" not in out
    ttft = re.search(r"time to first token \(the prompt's prefill, eager chunks\): plain ([0-9.]+) ms, "
                     r"relay ([0-9.]+) ms", out)
    assert ttft and float(ttft.group(1)) > 0 and float(ttft.group(2)) > 0, out


def test_run_sampled_plain_speculative_and_with_sampled_drafts(checkpoint, capsys):
    assert main(["run", "--checkpoint", str(checkpoint), "--prompt-ids", "3,1,4,1,5", "--new-tokens", "6",
                 "--steps", "3", "--device", "cpu", "--no-prefill-graphs", "--temperature", "0.8",
                 "--top-p", "0.9", "--seed", "2"]) == 0
    out = capsys.readouterr().out
    assert "sampled: temperature 0.8, top_p 0.9, seed 2" in out
    sampled = out.split("sampled:")[1]
    assert out.count("repeats under its seed") == 3 and "lingc NEXTN relay" in sampled
    assert "lingc relay, drafts sampled" in sampled and "compile + capture of the 5 sampled graphs" in sampled


def test_explain_a_checkpoint(checkpoint, capsys):
    assert main(["explain", "--checkpoint", str(checkpoint), "--t", "6", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert f"lingc explain: checkpoint {checkpoint}, T=6" in out and "lingc pass summary (role verify)" in out


@pytest.mark.parametrize("argv, message", [
    (["--preset", "tiny", "--checkpoint", "CKPT"], "give one of the two"),
    (["--checkpoint", "EMPTY"], r"cannot load --checkpoint: .*no config.json"),
    (["--prompt-ids", "1,x"], "want token ids separated by commas or whitespace"),
    (["--prompt-ids", "7,320,-1"], r"ids \[320, -1\] are outside the vocabulary \[0, 320\)"),
    (["--prompt-ids", ","], "no token ids given"),
    (["--new-tokens", "4090"], r"prompt 24 \+ --new-tokens 4090 \+ the relay's 12 rows ahead \(--steps 5\) = 4126 "
                               r"cache rows, more than the model's max_position_embeddings 4096: use at most "
                               r"--new-tokens 4060 with this prompt"),
    (["--prompt-len", "4090", "--steps", "7"], r"= 4154 cache rows, .* use a shorter prompt"),
    (["--preset", "tiny", "--prefill-graphs"], r"--prefill-graphs captures the prefill as CUDA graphs: it needs a "
                                               r"CUDA device \(this run is on cpu\)"),
])
def test_run_refuses_a_bad_source_or_prompt(checkpoint, tmp_path, argv, message):
    # Each refusal comes before the eager generation or any compile.
    argv = [str(checkpoint) if a == "CKPT" else str(tmp_path) if a == "EMPTY" else a for a in argv]
    with pytest.raises(SystemExit, match=message):
        main(["run", "--device", "cpu", *argv])


@pytest.mark.parametrize("cmd, argv, message", [
    ("run", ["--steps", "8"], r"--steps: invalid choice: 8 \(choose from 1, 2, 3, 4, 5, 6, 7\)"),
    ("explain", ["--steps", "0"], r"--steps: invalid choice: 0"),
    ("run", ["--new-tokens", "0"], r"--new-tokens: want an integer >= 1, got 0"),
    ("run", ["--prompt-len", "x"], r"--prompt-len: want an integer >= 1, got 'x'"),
    ("explain", ["--context", "-3"], r"--context: want an integer >= 0, got -3"),
    ("run", ["--temperature", "-1"], r"--temperature: want a finite number >= 0, got -1"),
    ("run", ["--top-p", "0"], r"--top-p: want a number in \(0, 1\], got 0"),
])
def test_bad_numbers_are_refused_by_the_parser(cmd, argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--preset", "tiny", "--device", "cpu", *argv])
    assert e.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_explain_refuses_a_context_past_the_positions():
    with pytest.raises(SystemExit, match=r"--context 4090 \+ 7 rows for the step = 4097 cache rows, more than the "
                                         r"model's max_position_embeddings 4096: use at most --context 4089"):
        main(["explain", "--preset", "tiny", "--device", "cpu", "--context", "4090", "--t", "7"])
    # A relay step needs 4 x (steps + 1) rows ahead; exactly the model's positions is accepted.
    with pytest.raises(SystemExit, match=r"--context 4081 \+ 16 rows for the step = 4097 cache rows"):
        main(["explain", "--preset", "tiny", "--device", "cpu", "--context", "4081", "--role", "verify-step",
              "--steps", "3"])
    assert main(["explain", "--preset", "tiny", "--device", "cpu", "--context", "4080", "--role", "verify-step",
                 "--steps", "3"]) == 0


@pytest.mark.parametrize("device, message", [
    ("bogus", r"--device bogus: not a device; use cpu or cuda"),
    ("meta", r"--device meta: lingc compiles with real tensors"),
    ("mps", r"--device mps: lingc runs on cpu or cuda"),
    ("cuda:64", r"--device cuda:64: this machine has (no CUDA GPU|\d+ CUDA GPU\(s\))"),
])
@pytest.mark.parametrize("cmd", ["run", "explain"])
def test_a_bad_device_is_refused_before_any_work(cmd, device, message):
    with pytest.raises(SystemExit, match=message):
        main([cmd, "--preset", "tiny", "--device", device])
