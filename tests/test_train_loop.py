"""Training steps, checkpoint/resume, features, export, and a tiny end-to-end run."""

import json
from collections import Counter

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from typer.testing import CliRunner

from dflash_mlx import Target, load, load_draft
from dflash_mlx.loading import read_safetensors
from dflash_mlx.models.draft import ModelArgs
from dflash_mlx.train.blocks import make_blocks
from dflash_mlx.train.data import Prompt, read_samples, regenerate, samples_for_training
from dflash_mlx.train.export import export_drafter, new_drafter, new_drafter_args
from dflash_mlx.train.features import FeatureStore, choose_mode, compute
from dflash_mlx.train.loop import TrainConfig, Trainer, measure_tau
from dflash_mlx.train.packed import block_loss, layer_masks


@pytest.fixture(scope="module")
def setup(tiny_pair, tmp_path_factory):
    t, _ = tiny_pair("llama")
    model, tok = load(str(t))
    folder = tmp_path_factory.mktemp("train")
    prompts = [
        Prompt(f"q{i}", [{"role": "user", "content": f"tell me about {i}"}])
        for i in range(3)
    ]
    list(regenerate(model, tok, prompts, folder / "responses.jsonl", max_tokens=24))
    samples = samples_for_training(read_samples(folder / "responses.jsonl"))
    args = new_drafter_args(Target(model), num_layers=1, block_size=8)
    target = Target(model, args.target_layer_ids)
    return t, model, tok, target, args, samples


def _trainer(setup, folder, seed=0, **cfg):
    _, _, tok, target, args, samples = setup
    store = FeatureStore(target, samples, "fly", folder)
    config = TrainConfig(
        **{
            "steps": 4,
            "batch_size": 2,
            "anchors": 8,
            "lr": 1e-3,
            "val_every": 0,
            "save_every": 0,
            **cfg,
        }
    )
    return Trainer(target, new_drafter(args, seed), tok, samples, store, config, folder)


def _params(model):
    return dict(tree_flatten(model.parameters()))


def test_one_step_lowers_the_loss_and_leaves_the_target_alone(setup, tmp_path):
    tr = _trainer(setup, tmp_path, steps=100, batch_size=1, warmup=0.0)
    sample, anchors = tr.micro_batch(0)
    blocks = make_blocks(sample.tokens, anchors, 8, tr.draft.args.mask_token_id)
    feats = compute(tr.target, sample.tokens)[:, : anchors.max()]
    before = block_loss(tr.target, tr.draft, feats, blocks)[0].item()
    target_before = _params(tr.target.model)
    m = tr.train_step()
    after = block_loss(tr.target, tr.draft, feats, blocks)[0].item()
    assert m["loss"] == pytest.approx(before, rel=1e-4)
    assert after < before - 1e-3
    assert tr.step == 1
    for k, v in _params(tr.target.model).items():
        assert mx.array_equal(v, target_before[k]).item(), k


def test_checkpoint_resume_reproduces_the_same_state(setup, tmp_path):
    straight = _trainer(setup, tmp_path / "a")
    list(straight.run())
    assert straight.step == 4

    first = _trainer(setup, tmp_path / "b", steps=4)
    first.train_step()
    first.train_step()
    first.save()
    resumed = _trainer(
        setup, tmp_path / "b", seed=123
    )  # a different init is overwritten
    assert resumed.resume() == 2
    events = list(resumed.run())
    assert resumed.step == 4 and events[0].step == 3
    a, b = _params(straight.draft), _params(resumed.draft)
    for k in a:
        assert mx.allclose(a[k], b[k], atol=1e-6).item(), k
    sa, sb = (
        dict(tree_flatten(straight.optimizer.state)),
        dict(tree_flatten(resumed.optimizer.state)),
    )
    assert sa.keys() == sb.keys()
    for k in sa:
        assert mx.allclose(sa[k], sb[k], atol=1e-6).item(), k
    assert [p.name for p in resumed.checkpoints()] == ["step-0000002", "step-0000004"]


def test_resume_refuses_another_drafter_shape(setup, tmp_path):
    tr = _trainer(setup, tmp_path, steps=1)
    list(tr.run())
    _, _, tok, target, args, samples = setup
    other = new_drafter(new_drafter_args(target, num_layers=2, block_size=8))
    tr2 = Trainer(target, other, tok, samples, tr.features, tr.config, tmp_path)
    with pytest.raises(ValueError, match="another drafter shape"):
        tr2.resume()


def test_cached_features_equal_on_the_fly(setup, tmp_path):
    _, _, _, target, _, samples = setup
    mode, why = choose_mode("auto", samples, target, tmp_path, budget_gb=1.0)
    assert mode == "cache" and "fits" in why
    assert choose_mode("auto", samples, target, tmp_path, budget_gb=1e-9)[0] == "fly"
    store = FeatureStore(target, samples, "cache", tmp_path, shard_size=2)
    progress = list(store.prepare())
    assert progress[-1].done == len(samples)
    assert len(list(store.folder.glob("shard-*.safetensors"))) == 2
    again = FeatureStore(target, samples, "cache", tmp_path)
    assert [p.done for p in again.prepare()] == [len(samples)]  # resumed: nothing to do
    for s in samples:
        # the cache keeps the bits `compute` returned
        assert mx.array_equal(again.get(s.id), compute(target, s.tokens)).item()


def test_exported_drafter_loads_here_and_in_the_reference(setup, tmp_path, monkeypatch):
    _, model, _, target, args, _ = setup
    draft = new_drafter(args, seed=3)
    out = export_drafter(
        draft, tmp_path / "drafter", {"target": "tiny", "tau": 1.5, "steps": 7}
    )
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["dflash_config"]["target_layer_ids"] == args.target_layer_ids
    assert (
        "τ" in (out / "README.md").read_text()
        and "1.50" in (out / "README.md").read_text()
    )
    mine = load_draft(str(out), target=model)
    want = _params(draft)
    assert _params(mine).keys() == want.keys()
    for k, v in _params(mine).items():
        assert mx.array_equal(v, want[k]).item(), k

    import dflash.model_mlx as ref

    monkeypatch.setattr(ref, "snapshot_download", lambda path, **kw: path)
    theirs = ref.load_draft(str(out))
    got = _params(theirs)
    for k, v in want.items():
        assert mx.array_equal(got[k], v).item(), k


def test_cli_trains_a_drafter_that_accepts_on_its_data(tiny_pair, tmp_path):
    from dflash_mlx.cli.main import app

    t, _ = tiny_pair("llama")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": f"Question {i}: what is {7 * i} plus {3 * i}?"})
            + "\n"
            for i in range(6)
        )
    )
    out = tmp_path / "run"
    args = [
        "train",
        "--target",
        str(t),
        "--out",
        str(out),
        "--prompts",
        str(prompts),
        "--val-prompts",
        "2",
        "--draft-layers",
        "1",
        "--block-size",
        "8",
        "--max-new-tokens",
        "24",
        "--steps",
        "300",
        "--batch-size",
        "1",
        "--anchors",
        "24",
        "--lr",
        "1e-2",
        "--val-every",
        "0",
        "--save-every",
        "100",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Drafter written to" in result.output and "held-out prompts" in result.output
    model, tok = load(str(t))
    draft = load_draft(str(out), target=model)
    samples = read_samples(out / "data" / "responses.jsonl")
    assert len(samples) == 4  # two prompts held out for validation
    n = min(len(s.response) for s in samples)
    tau = measure_tau(model, draft, tok, [s.prompt for s in samples], 8, max_tokens=n)
    assert tau > 2.0, tau
    # the last validation's acceptance by position ships beside it: auto's prior
    prior = draft.acceptance_prior
    assert prior.block_size == 8 and prior.prompts == 2 and prior.offered[0] > 0
    assert f"{prior.tau:.2f}" in (out / "README.md").read_text()
    # rerunning resumes: nothing to generate, no step to take, the same drafter
    (out / "acceptance.json").unlink()
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert "steps 300→300" in again.output
    assert load_draft(str(out)).acceptance_prior == prior  # measured again, the same


def test_cli_draft_vocab_and_init_from(tiny_pair, tmp_path):
    from dflash_mlx.cli.main import app

    t, _ = tiny_pair("llama")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"Count to {i}."}) + "\n" for i in range(5))
    )
    common = [
        "train",
        "--target",
        str(t),
        "--prompts",
        str(prompts),
        "--val-prompts",
        "1",
        "--draft-layers",
        "1",
        "--max-new-tokens",
        "16",
        "--batch-size",
        "1",
        "--anchors",
        "8",
        "--val-every",
        "0",
        "--steps",
        "1",
    ]
    first, second = tmp_path / "a", tmp_path / "b"
    result = CliRunner().invoke(
        app, common + ["--out", str(first), "--block-size", "8"]
    )
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(
        app,
        common
        + [
            "--out",
            str(second),
            "--block-size",
            "4",
            "--draft-vocab",
            "12",
            "--init-from",
            str(first),
            "--lr",
            "1e-12",
            "--draft-layers",  # one more than the donor's: grown
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "new layers [1] start as the identity" in " ".join(result.output.split())
    model, tok = load(str(t))
    donor, draft = (
        load_draft(str(first), target=model),
        load_draft(str(second), target=model),
    )
    assert draft.args.block_size == 4 and draft.args.draft_vocab_size == 12
    assert (len(donor.layers), len(draft.layers)) == (1, 2)
    assert "draft_vocab" not in read_safetensors(second / "model.safetensors")
    assert not (first / "draft_vocab.json").exists()
    assert mx.allclose(
        draft.fc.weight, donor.fc.weight, atol=1e-6
    ).item()  # started from it
    said = Counter(
        t for s in read_samples(first / "data" / "responses.jsonl") for t in s.response
    )
    assert set(draft.draft_vocab.tolist()) >= {t for t, n in said.most_common(5)}
    bad = CliRunner().invoke(
        app,
        common
        + ["--out", str(tmp_path / "c"), "--init-from", str(tmp_path / "nowhere")],
    )
    assert bad.exit_code == 2 and "--init-from" in bad.output


def test_sliding_window_drafters_keep_the_block_bidirectional(setup):
    _, model, _, target, _, _ = setup
    args = new_drafter_args(target, num_layers=2, block_size=8, sliding_window=12)
    assert args.layer_types == ["sliding_attention"] * 2
    assert (args.sliding_window, args.is_causal) == (12, False)
    again = ModelArgs.from_config(args.to_config())  # what export writes, read back
    assert (again.layer_types, again.sliding_window, again.is_causal) == (
        args.layer_types,
        12,
        False,
    )
    masks = layer_masks(new_drafter(args), np.array([20]), 8, 20)  # one block at 20
    mask = np.array(masks["sliding_attention"].context)
    assert masks["sliding_attention"].block is None  # each sees its whole block
    assert mask[0, 9:20].all() and not mask[0, :9].any()  # and 11 context positions
    assert mask[7, 16:20].all() and not mask[7, :16].any()  # within 12 of itself
    with pytest.raises(ValueError, match="--sliding-window 8 must exceed"):
        new_drafter_args(target, block_size=8, sliding_window=8)
