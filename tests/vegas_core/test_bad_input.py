"""Every refused input gets one clear message (API: a specific exception; CLI: exit 2, one line, no
traceback), and a running engine keeps serving its other requests."""
import math
import subprocess
import sys

import pytest

from vegas_core.errors import InvalidRequestError, ModelLoadError, UnsupportedArchitectureError
from vegas_core.sampling import SamplingParams
from vegas_core.spec import SpecParams

SAMPLING_CASES = [
    (dict(temperature=-0.5), "temperature"), (dict(temperature=math.nan), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_k=-2), "top_k"),
    (dict(min_p=-0.1), "min_p"), (dict(min_p=1.1), "min_p"), (dict(max_tokens=0), "max_tokens"),
]
SPEC_CASES = [
    (dict(gamma=0), "gamma must be an integer in [1, 16], got 0"),
    (dict(gamma=17), "gamma must be an integer in [1, 16], got 17"),
    (dict(sparsity=0.0), "sparsity must be in (0, 1], got 0.0"),
    (dict(sparsity=1.5), "sparsity must be in (0, 1], got 1.5"),
    (dict(min_budget=-1), "min_budget must be an integer >= 0, got -1"),
    (dict(method="medusa"), "unknown method 'medusa'; choose one of vanilla, stream, quest, specextend, vegas, vegas-all"),
    (dict(granularity="head"), "unknown granularity 'head'; choose one of layer, kv-head"),
]


@pytest.mark.parametrize("kwargs,field", SAMPLING_CASES)
def test_bad_sampling(kwargs, field):
    with pytest.raises(InvalidRequestError, match=field):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs,message", SPEC_CASES)
def test_bad_spec(kwargs, message):
    with pytest.raises(InvalidRequestError) as e:
        SpecParams(**kwargs)
    assert str(e.value) == message


def test_bad_requests_leave_a_running_request_undisturbed(engine):
    sampling = SamplingParams(max_tokens=12, ignore_eos=True)
    [alone] = engine.generate(["Name three colours."], sampling, chat=True)
    running = engine.add("Name three colours.", sampling, chat=True)
    for _ in range(3):
        engine.step()
    ctx = engine.config.max_position_embeddings
    with pytest.raises(InvalidRequestError, match="the prompt is empty"):
        engine.add("   ", sampling)
    with pytest.raises(InvalidRequestError, match="the prompt is empty"):
        engine.add([], sampling)
    with pytest.raises(InvalidRequestError, match=rf"prompt of 4 tokens plus max_tokens {ctx:,} is {ctx + 4:,}, "
                                                  rf"beyond the model's context of {ctx:,} tokens"):
        engine.add([1, 2, 3, 4], SamplingParams(max_tokens=ctx))
    with pytest.raises(InvalidRequestError, match=r"token id 49152 is outside the vocabulary \[0, 49152\)"):
        engine.add([5, 49152], sampling)
    with pytest.raises(InvalidRequestError, match=r"token id -1 is outside the vocabulary"):
        engine.add([-1], sampling)
    while not running.finished:
        engine.step()
    assert running.output_ids == alone.token_ids
    assert engine.core.allocator.num_free == engine.core.allocator.num_blocks


def test_model_paths(tmp_path, default_model):
    from vegas_core.loader import default_model_path, load_model
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(str(tmp_path / "nope.gguf"))
    half = tmp_path / "half.gguf"
    data = open(default_model_path(), "rb").read()
    half.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(str(half))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"\x00not a gguf file at all" * 100)
    with pytest.raises(ModelLoadError, match="GGUF"):
        load_model(str(junk))
    bad_arch = tmp_path / "neox"
    bad_arch.mkdir()
    (bad_arch / "config.json").write_text('{"model_type": "gpt_neox"}')
    with pytest.raises(UnsupportedArchitectureError, match="gpt_neox.*llama, mistral, qwen2, qwen3"):
        load_model(str(bad_arch))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "vegas_core", "generate", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("args,message", [
    (["--prompt", "hi", "--temperature", "-1"], "error: temperature"),
    (["--prompt", "hi", "--temperature", "nan"], "error: temperature"),
    (["--prompt", "hi", "--top-p", "0"], "error: top_p"),
    (["--prompt", "hi", "--top-k", "-5"], "error: top_k"),
    (["--prompt", "hi", "--min-p", "2"], "error: min_p"),
    (["--prompt", "hi", "--max-tokens", "0"], "error: max_tokens"),
    (["--prompt", "hi", "--gamma", "17"], "error: gamma must be an integer in [1, 16], got 17"),
    (["--prompt", "hi", "--sparsity", "0"], "error: sparsity must be in (0, 1], got 0.0"),
    (["--prompt", "hi", "--min-budget", "-3"], "error: min_budget must be an integer >= 0, got -3"),
    (["--prompt", "hi", "--method", "eagle"], "error: unknown method 'eagle'"),
    (["--prompt", "hi", "--granularity", "token"], "error: unknown granularity 'token'"),
    (["--prompt", "hi", "--model", "/no/such/model.gguf"], "error: "),
    (["--prompt", "", "--max-tokens", "4"], "error: the prompt is empty"),
    (["--prompt", "hi", "--max-tokens", "9000"], "beyond the model's context of 8,192 tokens"),
])
def test_cli_refuses_with_one_line(args, message):
    r = _cli(*args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") <= 1   # the message (and at most the model banner)


def test_cli_json_output():
    import json
    r = _cli("--prompt", "What is the capital of France? Answer in one sentence.", "--chat", "--json",
             "--max-tokens", "12", "--method", "vegas", "--gamma", "4", "--min-budget", "8")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["text"] == "The capital of France is Paris."
    for key in ("token_ids", "prompt_tokens", "generated_tokens", "decode_tokens_per_s",
                "mean_acceptance_length", "per_position_acceptance", "iterations"):
        assert key in out
    assert out["generated_tokens"] == len(out["token_ids"]) and out["decode_tokens_per_s"] > 0
