"""A drafter folder's extras beside the z-lab files: the draft vocabulary
(draft_vocab.json) and the measured acceptance (acceptance.json). Other runtimes must
load the folder as a plain z-lab drafter; ours reads the extras."""

import json
import os
import subprocess
import sys

import mlx.core as mx
import pytest
from fake_hub import FakeHub
from mlx.utils import tree_flatten
from test_draft_vocab import with_vocab

from dflash_mlx import load, load_draft
from dflash_mlx.loading import read_safetensors
from dflash_mlx.models.acceptance import Acceptance, read_acceptance, write_acceptance
from dflash_mlx.train.export import export_drafter, save_weights

VOCAB = [1, 2, 3, 100, 150]


@pytest.fixture(scope="module")
def exported(tiny_pair, tmp_path_factory):
    """(target dir, target model, the drafter, its export with a draft vocabulary)."""
    t, d = tiny_pair("qwen3")
    model, _ = load(str(t))
    draft = with_vocab(load_draft(str(d)), VOCAB)
    prior = Acceptance(draft.args.block_size, offered=[10, 6], accepted=[6, 3])
    out = tmp_path_factory.mktemp("export") / "vocab-dflash"
    export_drafter(draft, out, {"target": str(t)}, acceptance=prior)
    return t, model, draft, out


def test_export_keeps_the_vocabulary_out_of_the_weights(exported):
    _, model, draft, out = exported
    assert "draft_vocab" not in read_safetensors(out / "model.safetensors")
    assert json.loads((out / "draft_vocab.json").read_text()) == {"token_ids": VOCAB}
    loaded = load_draft(str(out), target=model)
    assert loaded.draft_vocab.tolist() == VOCAB
    assert loaded.draft_vocab.dtype == mx.int32
    assert mx.array_equal(loaded.fc.weight, draft.fc.weight).item()
    assert loaded.acceptance_prior.offered[:2] == [10, 6]


def test_an_older_export_with_the_vocabulary_inside_still_loads(exported, tmp_path):
    _, model, draft, out = exported
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text((out / "config.json").read_text())
    save_weights(draft, old / "model.safetensors")  # draft_vocab as a tensor
    assert "draft_vocab" in read_safetensors(old / "model.safetensors")
    loaded = load_draft(str(old), target=model)
    assert loaded.draft_vocab.tolist() == VOCAB
    assert loaded.acceptance_prior is None  # no acceptance.json: "auto" from scratch


def _copy(out, dst, skip=()):
    dst.mkdir()
    for f in out.iterdir():
        if f.name not in skip:
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


@pytest.mark.parametrize(
    "content, words",
    [
        (None, "has no draft_vocab.json"),
        ("{not json", "cannot be read"),
        (json.dumps({"token_ids": [1, 2]}), "must list 5 token ids"),
        (json.dumps({"token_ids": [1, 2, 3, 4, "5"]}), "must list 5 token ids"),
    ],
)
def test_a_missing_or_broken_vocabulary_file_says_how_to_fix(
    exported, tmp_path, content, words
):
    _, _, _, out = exported
    d = _copy(out, tmp_path / "d", skip={"draft_vocab.json"})
    if content is not None:
        (d / "draft_vocab.json").write_text(content)
    with pytest.raises(ValueError, match=words) as e:
        load_draft(str(d))
    assert "draft_vocab_size 5" in str(e.value)


@pytest.mark.parametrize(
    "content, words",
    [
        ("[1, 2", "cannot be read"),
        (json.dumps({"block_size": 4}), "cannot be read"),
        (
            json.dumps({"block_size": 4, "offered": [2, 1], "accepted": [3, 0]}),
            "more accepted drafts than offered",
        ),
    ],
)
def test_a_broken_acceptance_file_says_how_to_fix(exported, tmp_path, content, words):
    _, _, _, out = exported
    d = _copy(out, tmp_path / "d")
    (d / "acceptance.json").write_text(content)
    with pytest.raises(ValueError, match=words) as e:
        load_draft(str(d))
    assert "delete it" in str(e.value)


def test_acceptance_file_round_trip(tmp_path):
    a = Acceptance(4, offered=[8, 5, 2], accepted=[5, 2, 1], committed=30, steps=10)
    write_acceptance(tmp_path, a)
    b = read_acceptance(tmp_path)
    assert b == a and b.tau == 3.0
    record = json.loads((tmp_path / "acceptance.json").read_text())
    assert record["rates"] == [0.625, 0.4, 0.5]
    assert read_acceptance(tmp_path / "nowhere") is None


# Loads REPO from the fake Hub with the reference `dflash` and with ours; prints what
# each got.
BOTH = """
import json, sys
import mlx.core as mx
from mlx.utils import tree_flatten
from dflash.model_mlx import load_draft as reference_load_draft
from dflash_mlx import load_draft
theirs = dict(tree_flatten(reference_load_draft(sys.argv[1]).parameters()))
ours = load_draft(sys.argv[1])
mine = dict(tree_flatten(ours.parameters()))
same = all(mx.array_equal(v, mine[k]).item() for k, v in theirs.items())
print(json.dumps({"names": sorted(theirs), "same": same,
                  "vocab": ours.draft_vocab.tolist(),
                  "prior": ours.acceptance_prior.offered}))
"""


def test_the_reference_package_loads_the_export_from_the_hub(exported, tmp_path):
    """The way a user of another runtime gets it: the reference's own load_draft
    downloads the folder (its *.safetensors and *.json) and loads it strictly."""
    pytest.importorskip("dflash.model_mlx")
    _, _, draft, out = exported
    hub = FakeHub({"tiny-org/vocab-dflash": out})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(
        HF_ENDPOINT=hub.url,
        HF_HOME=str(tmp_path / "hf-home"),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_XET="1",
        NO_PROXY="127.0.0.1,localhost",
    )
    try:
        r = subprocess.run(
            [sys.executable, "-c", BOTH, "tiny-org/vocab-dflash"],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        hub.close()
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[-1])
    trained = {k for k, _ in tree_flatten(draft.parameters())} - {"draft_vocab"}
    assert set(got["names"]) == trained  # every weight, nothing extra
    assert got["same"] and got["vocab"] == VOCAB and got["prior"][:2] == [10, 6]
