"""The prefix cache (models/prefix.py, prefix_disk.py): a restored prefix gives the
tokens of a cold run on every family, recurrent ones included; shared prefixes are
stored once; the byte budgets hold; the disk copy survives a restart and refuses
what is not its own."""

import logging

import mlx.core as mx
import pytest

from dflash_mlx import load, load_draft, stream_generate
from dflash_mlx.engine.loop import as_target
from dflash_mlx.engine.prefill import prefill
from dflash_mlx.generate import make_prompt_cache
from dflash_mlx.models.prefix import PrefixStore
from dflash_mlx.models.prefix_disk import DiskSpill, FolderBusy, fingerprint
from dflash_mlx.models.snapshots import WINDOW_CUT, take_snapshot
from dflash_mlx.serve.engine import LADDER_STEP, snapshot_points

N = 12


@pytest.fixture(scope="module")
def pairs(tiny_pair):
    loaded = {}

    def get(family, **draft_kwargs):
        key = (family, tuple(sorted(draft_kwargs.items())))
        if key not in loaded:
            t, d = tiny_pair(family, **draft_kwargs)
            model, tok = load(str(t))
            # as `serve` loads it: the whole context, a KV history cut anywhere
            draft = load_draft(str(d), target=model, sliding_window_size=None)
            loaded[key] = (as_target(model, draft), draft, tok)
        return loaded[key]

    return get


def _generate(target, draft, tok, ids, cache):
    """Greedy tokens for `ids` on `cache` (it then holds ids + all but the last)."""
    responses = stream_generate(
        target, draft, tok, ids, prompt_cache=cache, max_tokens=N, block_size=4
    )
    return [t for r in responses for t in r.tokens]


def _served(store, target, draft, tok, ids):
    """Restore from `store`, generate, keep the result: (tokens, reused)."""
    cache, reused = store.restore(ids)
    tokens = _generate(target, draft, tok, ids, cache)
    store.insert(cache.tokens, cache, {})
    return tokens, reused


def _store(target, draft, budget=1 << 30, spill=None):
    return PrefixStore(lambda: make_prompt_cache(target, draft), budget, spill)


CASES = [("qwen3", {}), ("qwen3_5", {}), ("qwen3_moe", {}), ("llama", {})]
# a drafter whose sliding layers keep a window (a snapshot, not a span)
CASES += [("qwen3", {"layer_types": ("sliding_attention",) * 2, "sliding_window": 4})]


@pytest.mark.parametrize("family, draft_kwargs", CASES)
def test_a_follow_up_turn_reuses_its_history_and_gives_the_cold_tokens(
    pairs, family, draft_kwargs
):
    """Turn 2 resends turn 1 and its answer: it is served all of them, recurrent
    targets included, and generates exactly what a cold cache generates."""
    target, draft, tok = pairs(family, **draft_kwargs)
    store = _store(target, draft)
    turn1 = tok.encode("hello world, this is a test")
    answer, reused = _served(store, target, draft, tok, turn1)
    assert reused == 0
    turn2 = turn1 + answer + tok.encode(" and then?")
    tokens, reused = _served(store, target, draft, tok, turn2)
    assert reused == len(turn1) + len(answer) - 1  # all the caches held
    cold = _generate(target, draft, tok, turn2, make_prompt_cache(target, draft))
    assert tokens == cold


def test_the_same_prompt_again_is_served_all_but_its_last_token(pairs):
    """A retry: the drafter's window (a snapshot, taken at the answer's end) is cut
    back to the prompt's last token but one; the target's history is cut there; the
    tokens are the first run's. A prompt that shares less than that snapshot's end
    by more than WINDOW_CUT is served from no window cut that far."""
    windowed = {"layer_types": ("sliding_attention",) * 2, "sliding_window": 4}
    target, draft, tok = pairs("qwen3", **windowed)
    store = _store(target, draft)
    assert store.cut_back and not store.cut_anywhere
    ids = tok.encode("hello world, this is a test")
    first, reused = _served(store, target, draft, tok, ids)
    assert reused == 0
    cache, reused = store.restore(ids)
    assert reused == len(ids) - 1
    assert all(c.offset == len(ids) - 1 for c in cache.draft)  # cut back
    again = _generate(target, draft, tok, ids, cache)
    assert again == first
    long = tok.encode("lorem ipsum dolor sit amet " * 40)
    assert len(long) > WINDOW_CUT + 8
    _served(store, target, draft, tok, long)
    _, reused = store.restore(long[:8])
    assert reused == 0  # its only snapshot is too far past


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_a_new_conversation_with_a_known_system_part_reuses_it(pairs, family):
    """Two conversations share a system part: the second is served it (on a
    recurrent target, from the snapshot taken at its end) and stays exact."""
    target, draft, tok = pairs(family)
    store = _store(target, draft)
    system = tok.encode("You are a helpful assistant. Answer briefly.\n")
    first = system + tok.encode("What is 2+2?")
    cache = make_prompt_cache(target, draft)  # as a server prefills the first one
    prefill(target, draft, cache, system, 2048)
    snapshots = {len(system): take_snapshot(cache)}  # where the system part ends
    prefill(target, draft, cache, first[len(system) :], 2048)
    store.insert(cache.tokens, cache, snapshots)
    second = system + tok.encode("Name a colour.")
    cache, reused = store.restore(second)
    assert reused == len(system)
    tokens = _generate(target, draft, tok, second, cache)
    assert tokens == _generate(
        target, draft, tok, second, make_prompt_cache(target, draft)
    )


def test_a_restored_cache_has_room_for_the_prompt_and_the_first_blocks(pairs):
    """The restored KV layers are laid out with space for the prompt's rest and a
    KVCache step beyond: neither the prefill nor the first blocks copy the history
    to grow."""
    target, draft, tok = pairs("qwen3")
    store = _store(target, draft)
    turn1 = tok.encode("hello world, this is a test")
    answer, _ = _served(store, target, draft, tok, turn1)
    turn2 = turn1 + answer + tok.encode(" and then, at some length?")
    cache, reused = store.restore(turn2)
    assert reused > 0
    for layer in cache.target:
        assert layer.offset == reused
        assert layer.keys.shape[2] >= len(turn2) + layer.step


def test_the_snapshot_ladder_spares_a_follow_up_turn():
    """A long cold prompt gets rungs every LADDER_STEP tokens; a follow-up turn that
    crosses a rung just after its restored prefix is not split there."""
    step = LADDER_STEP
    assert snapshot_points(3 * step + 5, 0, ()) == [step, 2 * step, 3 * step]
    assert snapshot_points(3 * step + 100, 3 * step - 20, ()) == []
    assert snapshot_points(5 * step, 3 * step - 20, (3 * step,)) == [3 * step, 4 * step]
    assert snapshot_points(5 * step, 3 * step - 20, ()) == [4 * step]
    assert snapshot_points(2 * step, 0, (10, 2 * step)) == [10, step]


def test_a_shared_prefix_is_stored_once(pairs):
    target, draft, tok = pairs("qwen3")
    store = _store(target, draft)
    base = tok.encode("The same long system prompt for every conversation. " * 3)
    _served(store, target, draft, tok, base + tok.encode("one"))
    alone = store.nbytes
    _served(store, target, draft, tok, base + tok.encode("two"))
    _, reused = store.restore(base + tok.encode("three"))
    assert reused >= len(base)
    assert store.nbytes < 1.6 * alone  # the second kept only what is its own


def test_least_recently_used_prefixes_go_first_within_the_budget(pairs):
    target, draft, tok = pairs("qwen3")
    probe = _store(target, draft)
    _served(probe, target, draft, tok, tok.encode("conversation 0 " * 4))
    budget = int(probe.nbytes * 3.5)  # room for about three conversations
    store = _store(target, draft, budget)
    prompts = [tok.encode(f"{'ABCDEF'[i]} conversation " * 4) for i in range(6)]
    for i, ids in enumerate(prompts):
        _served(store, target, draft, tok, ids)
        assert store.nbytes <= budget
        if i >= 1:  # keep conversation 0 warm: it must survive its neighbours
            store.restore(prompts[0])
    assert store.restore(prompts[0])[1] > 0
    assert store.restore(prompts[1])[1] == 0 or store.restore(prompts[2])[1] == 0
    assert store.stats.evicted > 0


def test_the_disk_keeps_evicted_prefixes_across_a_restart(pairs, tmp_path):
    target, draft, tok = pairs("qwen3_5")
    mark = fingerprint(target, draft, "test")
    spill = DiskSpill(tmp_path / "cache", 1 << 30, mark)
    store = _store(target, draft, budget=1, spill=spill)  # every insert spills
    turn1 = tok.encode("hello world, this is a test")
    answer, _ = _served(store, target, draft, tok, turn1)
    assert spill.writes == 1 and store.nbytes == 0
    spill.close()
    # a restarted server: a new store over the same folder
    spill = DiskSpill(tmp_path / "cache", 1 << 30, mark)
    store = _store(target, draft, spill=spill)
    turn2 = turn1 + answer + tok.encode(" and then?")
    tokens, reused = _served(store, target, draft, tok, turn2)
    assert reused == len(turn1) + len(answer) - 1 and spill.reads == 1
    cold = _generate(target, draft, tok, turn2, make_prompt_cache(target, draft))
    assert tokens == cold
    spill.close()


def test_the_disk_refuses_what_is_not_its_own(pairs, tmp_path, caplog):
    target, draft, tok = pairs("qwen3")
    folder = tmp_path / "cache"
    spill = DiskSpill(folder, 1 << 30, fingerprint(target, draft, "test"))
    store = _store(target, draft, budget=1, spill=spill)
    for text in ("first conversation", "second conversation"):
        _served(store, target, draft, tok, tok.encode(text))
    files = sorted(folder.glob("*.safetensors"))
    assert len(files) == 2
    with pytest.raises(FolderBusy):  # a second server on the same folder
        DiskSpill(folder, 1 << 30, "another")
    spill.close()
    files[0].write_bytes(files[0].read_bytes()[:100])  # truncated
    (folder / "x.partial.safetensors").write_bytes(b"half")  # a write that died
    with caplog.at_level(logging.WARNING):
        other = DiskSpill(folder, 1 << 30, "another model")
    assert not list(folder.glob("*.safetensors*")) and not other.entries
    assert "unreadable" in caplog.text and "another model, drafter" in caplog.text
    other.close()


def test_the_disk_budget_is_never_exceeded_and_errors_are_clear(pairs, tmp_path):
    target, draft, tok = pairs("qwen3")
    mark = fingerprint(target, draft, "test")
    probe = DiskSpill(tmp_path / "probe", 1 << 30, mark)
    store = _store(target, draft, budget=1, spill=probe)
    _served(store, target, draft, tok, tok.encode("conversation 0 " * 4))
    one = probe.nbytes
    probe.close()
    spill = DiskSpill(tmp_path / "cache", int(one * 2.5), mark)
    store = _store(target, draft, budget=1, spill=spill)
    for i in range(5):
        _served(store, target, draft, tok, tok.encode(f"conversation {i} " * 4))
        on_disk = sum(f.stat().st_size for f in (tmp_path / "cache").glob("*"))
        assert on_disk <= spill.max_bytes
    assert len(spill.entries) == 2
    spill.close()
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    with pytest.raises(ValueError, match="not writable.*--prompt-cache-dir"):
        DiskSpill(blocked / "cache", 1 << 30, mark)


def test_a_fingerprint_tells_fine_tunes_apart(pairs):
    target, draft, tok = pairs("qwen3")
    before = fingerprint(target, draft, "1")
    assert fingerprint(target, draft, "2") != before
    weight = draft.layers[0].mlp.down_proj.weight
    draft.layers[0].mlp.down_proj.weight = weight + 1e-3  # another drafter, same shapes
    try:
        assert fingerprint(target, draft, "1") != before
    finally:
        draft.layers[0].mlp.down_proj.weight = weight
    mx.eval(weight)
