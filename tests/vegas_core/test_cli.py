"""The command line as a user drives it: every refusal is one `error:` line and exit 2, found before
the model loads where it can be; a closed pipe ends quietly; the result is never lost to a trace path."""
import json
import os
import subprocess
import sys

from vegas_core.sampling import SamplingParams
from vegas_core.spec import SpecParams

CLI = [sys.executable, "-m", "vegas_core", "generate"]


def _cli(*args, timeout=300):
    return subprocess.run([*CLI, *args], capture_output=True, timeout=timeout)


def _refused(r, message: str):
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode == 2, err
    assert "Traceback" not in err and err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err, err


def test_a_non_utf8_prompt_byte_is_refused_before_loading():
    _refused(_cli("--prompt", b"caf\xe9 au lait"), "error: the prompt is not valid UTF-8 text: byte 0xe9 at character 3")


def test_trace_paths_that_cannot_be_written_are_refused_before_loading(tmp_path):
    _refused(_cli("--prompt", "hi", "--trace", str(tmp_path / "missing" / "t.json")), "does not exist")
    _refused(_cli("--prompt", "hi", "--trace", str(tmp_path)), "is a directory")
    assert os.listdir(tmp_path) == []


def test_json_result_and_trace(tmp_path):
    from vegas_core.trace import load_trace
    r = _cli("--prompt", "Hello", "--max-tokens", "3", "--json", "--trace", str(tmp_path / "t.json"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["generated_tokens"] == 3
    assert len(load_trace(tmp_path / "t.json").requests[0].output_token_ids) == 3
    assert os.listdir(tmp_path) == ["t.json"]     # no temporary file left


def test_deterministic_flag_says_which_mode_ran():
    """On the CPU the reference path runs: --deterministic is accepted, and the output says so."""
    r = _cli("--prompt", "Hello", "--max-tokens", "2", "--json", "--deterministic")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["mode"] == "reference"
    assert "--deterministic applies to the Triton kernel path" in r.stderr.decode()


def test_a_closed_pipe_ends_quietly():
    proc = subprocess.Popen([*CLI, "--prompt", "Tell me a long story.", "--max-tokens", "40", "--ignore-eos"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(5)          # `| head -c 5`
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(300) == 141 and "Traceback" not in err and "Error" not in err, err


def test_stop_string_with_vegas_gives_the_ids_vanilla_gives(engine):
    args = ("--prompt", "The capital of France is", "--stop", "The answer", "--max-tokens", "16")
    [vanilla] = engine.generate([args[1]], SamplingParams(max_tokens=16, stop=("The answer",)),
                                SpecParams(method="vanilla"))
    r = _cli(*args, "--json", "--method", "vegas", "--min-budget", "4")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["token_ids"] == vanilla.token_ids and out["text"] == vanilla.text
    assert out["finish_reason"] == "stop"
