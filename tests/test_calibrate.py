"""The load-time warm-up times every block size for the adaptive policy (calibrate.py):
a fresh chat or `generate` starts with every size timed, no exploration."""

import json

import pytest

from dflash_mlx import load, load_draft
from dflash_mlx.engine.calibrate import _adopt, _Schedule, calibrate
from dflash_mlx.engine.policy import AdaptiveBlockSize
from dflash_mlx.models.acceptance import Acceptance


@pytest.fixture(scope="module")
def pair(tiny_pair):
    t, d = tiny_pair("qwen3")
    model, tok = load(str(t))
    return t, d, model, tok, load_draft(str(d))


def test_calibrate_times_every_size_and_learns_no_acceptance(pair):
    _, _, model, tok, draft = pair
    saved = tok.eos_token_ids
    tok.eos_token_ids = set()  # the schedule in one generation
    draft.acceptance_prior = Acceptance(draft.args.block_size, [10], [5])
    try:
        policy = calibrate(model, draft, tok)
    finally:
        draft.acceptance_prior = None
        tok.eos_token_ids = saved
    sizes = policy.sizes
    assert sizes == [1, 2, 4, 8]
    assert sorted(policy.seconds) == sizes and sorted(policy.verify_seconds) == sizes
    assert all(
        v > 0 for v in [*policy.seconds.values(), *policy.verify_seconds.values()]
    )
    assert policy.offered == [0.0] * 8 and policy.blocks == 0  # a throwaway prompt
    assert policy.acceptance(1) == pytest.approx(0.5)  # the drafter's prior kept
    # timed, but each size still runs once for real (its cut), largest first
    assert policy.next() == 8


def test_the_schedule_runs_its_order_then_plain_steps():
    s = _Schedule([8, 8, 4, 1])
    assert s.next() == 8 and s.next(limit=3) == 3 and s.cut([0.1, 0.2]) == 2
    s.observe(8, 2, 0.5, verified=8, verify_seconds=0.4)
    s.observe(8, 0, 0.3, verified=8, verify_seconds=0.25)
    assert s.remaining == [4, 1] and s.next() == 4
    s.observe(4, 0, 0.2, verified=3, verify_seconds=0.15)  # capped by the budget
    s.observe(1, 0, 0.1, verified=1, verify_seconds=0.1)
    assert s.remaining == [] and s.next() == 1
    s.observe(1, 0, 9.0, verified=1, verify_seconds=9.0)  # past the schedule: ignored
    policy = AdaptiveBlockSize(8)
    _adopt(policy, s.measured)
    # the last run of a size counts (the first compiled kernels); capped runs do not
    assert policy.seconds == {8: 0.3, 1: 0.1}
    assert policy.verify_seconds == {8: 0.25, 1: 0.1}


def test_a_stop_token_early_retries_what_is_left(pair, monkeypatch):
    _, _, model, tok, draft = pair
    from dflash_mlx.engine import calibrate as module

    runs = []

    def stopping(model, draft, tokenizer, ids, block_size, max_tokens):
        runs.append(list(block_size.order))
        for size in block_size.order[:2]:  # two blocks, then a "stop token"
            block_size.observe(size, 0, 0.1 * size, verified=size, verify_seconds=0.05)
            yield None

    monkeypatch.setattr(module, "_generate", stopping)
    policy = module.calibrate(model, draft, tok)
    assert runs == [[8, 8, 4, 4, 2, 2, 1, 1], [4, 4, 2, 2, 1, 1], [2, 2, 1, 1]]
    assert sorted(policy.seconds) == [2, 4, 8]  # size 1 left for the policy to time


def test_open_session_hands_the_calibrated_policy_to_the_chat(pair):
    from dflash_mlx.cli.session import open_session

    t, d, _, _, _ = pair
    session, _ = open_session(str(t), str(d), False)
    policy = session._block_policy()
    assert isinstance(policy, AdaptiveBlockSize)
    assert sorted(policy.seconds) == policy.sizes  # timed before the first turn
    assert session._block_policy() is policy  # one per session, kept across turns
    plain, _ = open_session(str(t), None, True)
    assert plain._block_policy() == 1


def test_timings_are_kept_for_the_next_process(pair, tmp_path, monkeypatch):
    """A full calibration writes its timings; a later one reads them back and runs
    only one drafted block of the largest size (a warm-up, no schedule)."""
    _, _, model, tok, draft = pair
    from dflash_mlx.engine import calibrate as module

    path = tmp_path / "timings" / "pair.json"
    first = module.calibrate(model, draft, tok, timings=path)
    stored = json.loads(path.read_text())
    assert {int(k) for k in stored["seconds"]} == set(first.sizes)
    assert {int(k) for k in stored["verify_seconds"]} == set(first.sizes)

    runs = []

    def recording(model, draft, tokenizer, ids, block_size=None, max_tokens=0, **_):
        runs.append((draft, block_size, max_tokens))
        yield None

    monkeypatch.setattr(module, "_generate", recording)
    second = module.calibrate(model, draft, tok, timings=path)
    assert second.seconds == first.seconds
    assert second.verify_seconds == first.verify_seconds
    assert runs == [(draft, 8, 9)]
    assert second.next() == 8  # each size still runs once for real, largest first


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        '{"seconds": {"8": 0.1}}',
        '{"seconds": {"8": 0.1, "4": 0.1, '
        '"2": 0.1, "1": -1}, "verify_seconds": {"8": 1, "4": 1, "2": 1, "1": 1}}',
        "[]",
    ],
)
def test_a_broken_timings_file_is_measured_again_and_replaced(pair, tmp_path, content):
    _, _, model, tok, draft = pair
    from dflash_mlx.engine import calibrate as module

    path = tmp_path / "pair.json"
    path.write_text(content)
    policy = module.calibrate(model, draft, tok, timings=path)
    assert sorted(policy.seconds) == policy.sizes
    assert all(v > 0 for v in policy.seconds.values())
    assert json.loads(path.read_text())["seconds"] == {
        str(k): v for k, v in policy.seconds.items()
    }


def test_an_unwritable_timings_folder_only_costs_the_calibration(pair, tmp_path):
    _, _, model, tok, draft = pair
    from dflash_mlx.engine import calibrate as module

    blocker = tmp_path / "file"
    blocker.write_text("")
    policy = module.calibrate(model, draft, tok, timings=blocker / "sub" / "t.json")
    assert sorted(policy.seconds) == policy.sizes


def test_the_timings_file_is_keyed_by_pair_and_machine(tmp_path):
    from dflash_mlx.engine.calibrate import timings_file

    a = timings_file(tmp_path, "target-a", "draft-a")
    assert a == timings_file(tmp_path, "target-a", "draft-a")
    assert a.parent == tmp_path and a.suffix == ".json"
    assert a != timings_file(tmp_path, "target-b", "draft-a")
    assert a != timings_file(tmp_path, "target-a", "draft-b")


def test_open_session_keeps_timings_in_the_user_cache(pair, tmp_path, monkeypatch):
    from dflash_mlx.cli.session import open_session

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    t, d, _, _, _ = pair
    first, _ = open_session(str(t), str(d), False)
    files = list((tmp_path / "dflash-mlx" / "timings").glob("*.json"))
    assert len(files) == 1
    second, _ = open_session(str(t), str(d), False)
    assert second._block_policy().seconds == first._block_policy().seconds
