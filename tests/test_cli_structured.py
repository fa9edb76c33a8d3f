"""`generate`/`chat --json-schema FILE` and `--grammar FILE` through the real command:
the answer is valid, and equal to plain decoding under the same grammar (--check)."""

import json

import pytest
from typer.testing import CliRunner

from dflash_mlx.cli.main import app

runner = CliRunner()
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["answer", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def paths(tiny_pair):
    t, d = tiny_pair("qwen3")
    return str(t), str(d)


def invoke(*args, input=None):
    return runner.invoke(
        app, [str(a) for a in args], input=input, catch_exceptions=False
    )


def test_generate_json_schema_is_valid_and_equals_constrained_plain(paths, tmp_path):
    t, d = paths
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    args = ("generate", "-p", "Tell me", "-m", t, "-d", d, "-n", 60, "--json")
    r = invoke(*args, "--json-schema", schema, "--check", "-b", 4)
    assert r.exit_code == 0, r.output
    record = json.loads(r.stdout)
    assert record["exactness"]["verdict"] == "identical"
    assert record["finish_reason"] == "stop"
    answer = json.loads(record["text"])
    assert answer["answer"] in ("yes", "no") and isinstance(answer["n"], int)
    plain = json.loads(invoke(*args, "--json-schema", schema, "--no-draft").stdout)
    assert plain["text"] == record["text"]


def test_generate_lark_grammar(paths, tmp_path):
    t, d = paths
    grammar = tmp_path / "g.lark"
    grammar.write_text('start: "yes" | "no"\n')
    r = invoke("generate", "-p", "Tell me", "-m", t, "-d", d, "--grammar", grammar)
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() in ("yes", "no")


def test_chat_json_schema(paths, tmp_path):
    t, d = paths
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    r = invoke("chat", "-m", t, "-d", d, "--json-schema", schema, input="hi\n")
    assert r.exit_code == 0, r.output
    assert '"answer"' in r.stdout


@pytest.mark.parametrize(
    "content, option, words",
    [
        ("{nope", "--json-schema", "not valid JSON"),
        ("[1]", "--json-schema", "must be a JSON object"),
        (None, "--json-schema", "cannot read"),
    ],
)
def test_bad_grammar_files_are_usage_errors(paths, tmp_path, content, option, words):
    t, d = paths
    path = tmp_path / "bad"
    if content is not None:
        path.write_text(content)
    r = invoke("generate", "-p", "x", "-m", t, option, path)
    assert r.exit_code == 2 and words in r.output


def test_a_schema_the_library_rejects_is_a_runtime_error(paths, tmp_path):
    t, d = paths
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"type": "no-such-type"}))
    r = invoke("generate", "-p", "x", "-m", t, "--json-schema", path)
    assert r.exit_code == 1 and "is not valid" in r.output


def test_both_options_are_refused(paths, tmp_path):
    t, d = paths
    path = tmp_path / "s.json"
    path.write_text("{}")
    r = invoke("generate", "-p", "x", "-m", t, "--json-schema", path, "--grammar", path)
    assert r.exit_code == 2 and "not both" in r.output
