"""`python -m lingc run|explain` on a checkpoint directory instead of a preset's random weights,
with the prompt given as token ids; and the errors for a clashing or broken source or prompt."""
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
                 "--steps", "3", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert f"lingc: loading checkpoint {checkpoint} on cpu" in out
    assert "prompt: 5 given tokens; 6 new tokens" in out
    assert out.count("tokens identical to eager") == 2 and "random weights" not in out


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
])
def test_run_refuses_a_bad_source_or_prompt(checkpoint, tmp_path, argv, message):
    argv = [str(checkpoint) if a == "CKPT" else str(tmp_path) if a == "EMPTY" else a for a in argv]
    with pytest.raises(SystemExit, match=message):
        main(["run", "--device", "cpu", *argv])
