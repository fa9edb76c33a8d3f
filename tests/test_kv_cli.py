"""`--kv-bits` / `--kv-group-size` on generate, chat and serve: values MLX's KV
quantization cannot take are usage errors naming the choices (exit 2, before any model
loads); a group size the target's heads cannot take exits 1; a quantized generate
passes its own `--check` against plain decoding on the same quantized cache."""

import json

import pytest
import tiny
from typer.testing import CliRunner

from dflash_mlx.cli.main import app

NOWHERE = "/no/such/model"  # a usage error must be found before this fails to load
BAD = {
    "bits 3": (["--kv-bits", "3"], "expected 4 or 8, got '3'"),
    "bits 16": (["--kv-bits", "16"], "expected 4 or 8, got '16'"),
    "bits text": (["--kv-bits", "eight"], "expected 4 or 8, got 'eight'"),
    "group 48": (["--kv-group-size", "48"], "expected 32, 64 or 128, got '48'"),
    "group text": (["--kv-group-size", "x"], "expected 32, 64 or 128"),
}
COMMANDS = {
    "generate": ["generate", "-p", "hi", "-m", NOWHERE],
    "chat": ["chat", "-m", NOWHERE],
    "serve": ["serve", "-m", NOWHERE, "--port", "0"],
}


def invoke(*args, input=None):
    result = CliRunner().invoke(app, [str(a) for a in args], input=input)
    assert "Traceback" not in result.output, result.output
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), repr(result.exception)
    return result


def flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("case", list(BAD))
def test_values_mlx_cannot_quantize_with_are_usage_errors(command, case):
    extra, words = BAD[case]
    r = invoke(*COMMANDS[command], *extra)
    assert r.exit_code == 2, r.output
    assert words in flat(r.output)
    option = extra[0]
    assert option in flat(r.output)
    assert "neither an existing folder" not in r.output  # no load was tried


@pytest.fixture(scope="module")
def pair(models_dir):
    t = models_dir / "qwen3-kv-cli-target"
    if not t.exists():
        tiny.make_target(t, "qwen3", head_dim=32)
    d = tiny.make_draft(models_dir / "qwen3-kv-cli-draft", t)
    return str(t), str(d)


def test_a_group_size_the_heads_cannot_take_exits_1(pair):
    t, d = pair
    r = invoke("generate", "-p", "hi", "-m", t, "-d", d, "--kv-bits", "8")
    assert r.exit_code == 1, r.output
    assert "use a kv_group_size that divides its head size" in flat(r.output)


@pytest.mark.parametrize("bits", ["8", "4"])
def test_a_quantized_generate_passes_its_check(pair, bits):
    t, d = pair
    args = ["generate", "-p", "Tell me", "-m", t, "-d", d, "-n", 24, "--json"]
    kv = ["--kv-bits", bits, "--kv-group-size", "32"]
    r = invoke(*args, *kv, "--check")
    assert r.exit_code == 0, r.output
    record = json.loads(r.stdout)
    assert record["exactness"]["verdict"] == "identical"
    plain = json.loads(invoke(*args, *kv, "--no-draft").stdout)
    assert record["tokens"] == plain["tokens"]
    if bits == "4":  # the cache was quantized (8 bits give the float tokens here)
        floating = json.loads(invoke(*args, "--no-draft").stdout)
        assert record["tokens"] != floating["tokens"]
