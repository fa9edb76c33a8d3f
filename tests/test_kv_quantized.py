"""A quantized KV cache (`kv_bits`): greedy DFlash equals plain decoding with the same
quantized cache, a verify block writes the entries single steps write, and rollback
is exact."""

import mlx.core as mx
import pytest
import tiny
from lossless import oracle
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import QuantizedKVCache
from numerics import assert_close

from dflash_mlx import load, load_draft, make_prompt_cache, stream_generate
from dflash_mlx.engine.loop import as_target

GROUP = 32  # the tiny targets' heads have 32 dimensions here
# gemma4_text: 9 layers, so a full-attention layer (2) is neither sliding nor a KV
# source of the shared layers (those stay float)
OVERRIDES = {
    "qwen3": dict(head_dim=32),
    "qwen3_5": dict(head_dim=32),
    "gemma4_text": dict(head_dim=32, global_head_dim=32, num_hidden_layers=9),
}
PROMPT = "hello world, this is a test"
N = 32


@pytest.fixture(scope="module")
def pairs(models_dir):
    out = {}

    def get(family):
        if family not in out:
            t = models_dir / f"{family}-kv-target"
            if not t.exists():
                tiny.make_target(t, family, **OVERRIDES[family])
            d = tiny.make_draft(models_dir / f"{family}-kv-draft", t)
            model, tok = load(str(t))
            out[family] = (model, tok, load_draft(str(d)))
        return out[family]

    return get


def reference(model, draft, tok, ids, bits):
    """mlx-lm's own greedy decoding on the caches `kv_bits` gives the target, up to
    and with the first stop token (as stream_generate stops)."""
    caches = as_target(model, draft).make_cache(bits, GROUP) if bits else None
    steps = generate_step(mx.array(ids), model, prompt_cache=caches, max_tokens=N)
    out = []
    for y, _ in steps:
        out.append(int(y))
        if out[-1] in tok.eos_token_ids:
            break
    return out


def run(model, draft, tok, ids, **kw):
    responses = stream_generate(model, draft, tok, ids, max_tokens=N, **kw)
    return [t for r in responses for t in r.tokens]


@pytest.mark.parametrize("family", list(OVERRIDES))
@pytest.mark.parametrize("bits", [8, 4])
def test_greedy_equals_plain_with_the_same_quantization(pairs, family, bits):
    model, tok, draft = pairs(family)
    ids = tok.encode(PROMPT)
    caches = as_target(model, draft).make_cache(bits, GROUP)
    assert any(isinstance(c, QuantizedKVCache) for c in caches)
    ref = reference(model, draft, tok, ids, bits)
    kv = dict(kv_bits=bits, kv_group_size=GROUP)
    assert run(model, None, tok, ids, **kv) == ref  # this package's plain decoding
    half = oracle(draft, ids + ref, lambda k, i: i % 5 == 0)
    for block_size in (2, 4, 8, "auto"):
        for drafter in (draft, half):
            out = run(model, drafter, tok, ids, block_size=block_size, **kv)
            assert out == ref, (block_size, drafter is half)


def test_the_quantization_changes_the_output(pairs):
    """So the test above compares against the quantized cache, not the float one."""
    model, tok, draft = pairs("qwen3")
    ids = tok.encode(PROMPT)
    assert reference(model, draft, tok, ids, 4) != reference(
        model, draft, tok, ids, None
    )


def _quantized(cache) -> list:
    """Per quantized layer: (packed keys, scales, biases, the same for the values,
    bits) up to its offset."""
    out = []
    for c in cache:
        if isinstance(c, QuantizedKVCache):
            arrays = [a[..., : c.offset, :] for a in (*c.keys, *c.values)]
            out.append((arrays, c.bits))
    return out


def assert_same_entries(a: list, b: list, exact: bool):
    """Bit for bit where the target's kernels are batch-invariant (the CPU's for
    qwen3). On MLX's generic kernels a token's keys computed in a block round
    differently in the last bits, and so do their scales and biases (a code may
    flip at a rounding boundary): the entries then agree within one quantization
    step, where a wrong token's would be many steps off."""
    assert len(a) == len(b) > 0
    for (x, bits), (y, _) in zip(a, b, strict=True):
        if exact:
            assert all(mx.array_equal(u, v).item() for u, v in zip(x, y, strict=True))
            continue
        for i in (0, 3):
            dx = mx.dequantize(*x[i : i + 3], group_size=GROUP, bits=bits)
            dy = mx.dequantize(*y[i : i + 3], group_size=GROUP, bits=bits)
            step = mx.abs(x[i + 1]).max().item()
            assert mx.abs(dx - dy).max().item() <= step


def assert_same_hidden(target, a: mx.array, b: mx.array):
    if target.cpu_blocks:
        assert mx.array_equal(a, b).item()
    else:
        assert_close(a, b, target.num_layers + 1, "hidden")


@pytest.mark.parametrize("family", list(OVERRIDES))
def test_a_verify_block_writes_what_single_steps_write(pairs, family):
    """Quantization is per token vector (groups along the head dimension), so a
    block's keys quantize to the entries each token's alone does, as far as the
    float keys agree: bit for bit on the CPU's batch-invariant kernels."""
    model, tok, draft = pairs(family)
    target = as_target(model, draft)
    prompt, block = mx.array([tok.encode(PROMPT)]), mx.arange(11, 17)[None]
    together, alone = target.make_cache(8, GROUP), target.make_cache(8, GROUP)
    target(prompt, together)
    target(prompt, alone)
    hidden, _ = target(block, together)
    steps = [target(block[:, i : i + 1], alone)[0] for i in range(block.shape[1])]
    assert target.cpu_blocks == (family == "qwen3")
    assert_same_entries(_quantized(together), _quantized(alone), target.cpu_blocks)
    assert_same_hidden(target, hidden, mx.concatenate(steps, axis=1))


@pytest.mark.parametrize("family", list(OVERRIDES))
@pytest.mark.parametrize("keep", [0, 3, 8])
def test_rollback_is_exact(pairs, family, keep):
    """A verify of 8 trimmed to `keep` tokens holds what a forward of those holds,
    and continues as it does."""
    model, tok, draft = pairs(family)
    target = as_target(model, draft)
    prompt, block = mx.array([tok.encode(PROMPT)]), mx.arange(20, 28)[None]
    spec, fresh = target.make_cache(4, GROUP), target.make_cache(4, GROUP)
    target(prompt, spec)
    target(prompt, fresh)
    before = _quantized(spec)
    tape: list = []
    target(block, spec, tape)
    target.rollback(spec, tape, block.shape[1], keep)
    if keep:
        target(block[:, :keep], fresh)
    else:  # nothing kept: the entries before the block, bit for bit
        assert_same_entries(before, _quantized(spec), exact=True)
    offsets = [[getattr(c, "offset", None) for c in x] for x in (spec, fresh)]
    assert offsets[0] == offsets[1]
    assert_same_entries(_quantized(spec), _quantized(fresh), target.cpu_blocks)
    nxt = mx.array([[200, 201]])
    assert_same_hidden(target, target(nxt, spec)[0], target(nxt, fresh)[0])
    assert_same_entries(_quantized(spec), _quantized(fresh), target.cpu_blocks)


def test_a_prompt_cache_keeps_its_quantization(pairs):
    model, tok, draft = pairs("qwen3")
    ids = tok.encode(PROMPT)
    cache = make_prompt_cache(model, draft, kv_bits=8, kv_group_size=GROUP)
    assert any(isinstance(c, QuantizedKVCache) for c in cache.target)
    first = run(model, draft, tok, ids, prompt_cache=cache)  # as the cache is
    assert first == reference(model, draft, tok, ids, 8)
    follow = ids + first + tok.encode(" and more")  # the next turn trims and reuses
    again = run(
        model, draft, tok, follow, prompt_cache=cache, kv_bits=8, kv_group_size=GROUP
    )
    assert again == reference(model, draft, tok, follow, 8)
    with pytest.raises(ValueError, match="made with kv_bits=8"):
        run(model, draft, tok, ids, prompt_cache=cache, kv_bits=4, kv_group_size=GROUP)


@pytest.mark.parametrize(
    "bits, group, message",
    [
        (16, 64, "kv_bits must be one of 2, 3, 4, 5, 6, 8"),
        ("8", 64, "kv_bits must be one of"),
        (8, 48, "kv_group_size must be one of 32, 64, 128"),
        (8, 64, "divides its head size"),  # 64 does not divide the heads' 32
    ],
)
def test_bad_kv_options(pairs, bits, group, message):
    model, tok, draft = pairs("qwen3")
    with pytest.raises(ValueError, match=message):
        run(model, draft, tok, [1, 2, 3], kv_bits=bits, kv_group_size=group)
    with pytest.raises(ValueError, match=message):
        make_prompt_cache(model, draft, kv_bits=bits, kv_group_size=group)


def _store(target, draft, bits, budget=1 << 30, spill=None):
    from dflash_mlx.models.prefix import PrefixStore

    return PrefixStore(
        lambda: make_prompt_cache(target, draft, bits, GROUP), budget, spill
    )


def _served(store, target, draft, tok, ids):
    """Restore from `store`, generate greedily, keep the result: (tokens, reused)."""
    cache, reused = store.restore(ids)
    tokens = run(target, draft, tok, ids, prompt_cache=cache, block_size=4)
    store.insert(cache.tokens, cache, {})
    return tokens, reused


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_the_prefix_cache_restores_a_quantized_cache_exactly(pairs, family):
    """The server's prefix cache keeps a quantized layer's packed keys, scales and
    biases: a restored cache continues as the one it was stored from (the tokens of
    a cold run and of mlx-lm on the same quantized caches), split nodes too."""
    model, tok, draft = pairs(family)
    target = as_target(model, draft)
    store = _store(target, draft, 8)
    turn1 = tok.encode(PROMPT)
    answer, reused = _served(store, target, draft, tok, turn1)
    _served(store, target, draft, tok, turn1[:10] + tok.encode(" elsewhere"))  # split
    turn2 = turn1 + answer + tok.encode(" and then?")
    cache, reused = store.restore(turn2)
    assert reused == len(turn1) + len(answer) - 1
    quantized = [c for c in cache.target if isinstance(c, QuantizedKVCache)]
    assert quantized and all(c.offset == reused for c in quantized)
    tokens = run(target, draft, tok, turn2, prompt_cache=cache, block_size=4)
    assert tokens == reference(model, draft, tok, turn2, 8)


def test_the_disk_keeps_quantized_prefixes_for_its_own_quantization(pairs, tmp_path):
    from dflash_mlx.models.prefix_disk import DiskSpill, fingerprint

    model, tok, draft = pairs("qwen3")
    target = as_target(model, draft)
    folder, marks = tmp_path / "cache", {}
    for kv in ("8/32", "4/32", ""):
        marks[kv] = fingerprint(target, draft, "test", kv)
    assert len(set(marks.values())) == 3  # a float server refuses 8-bit files
    spill = DiskSpill(folder, 1 << 30, marks["8/32"])
    store = _store(target, draft, 8, budget=1, spill=spill)  # every insert spills
    turn1 = tok.encode(PROMPT)
    answer, _ = _served(store, target, draft, tok, turn1)
    assert spill.writes == 1
    spill.close()
    spill = DiskSpill(folder, 1 << 30, marks["8/32"])  # a restarted server
    store = _store(target, draft, 8, spill=spill)
    turn2 = turn1 + answer + tok.encode(" and then?")
    tokens, reused = _served(store, target, draft, tok, turn2)
    assert reused == len(turn1) + len(answer) - 1 and spill.reads == 1
    assert tokens == reference(model, draft, tok, turn2, 8)
    spill.close()


def test_the_server_decodes_quantized_requests_one_at_a_time(pairs):
    """The batch's caches are float: with kv_bits the server decodes each request on
    its own quantized caches (the unbatched lane), and two concurrent requests each
    get the text of a plain run on the same quantized cache."""
    import threading

    import httpx
    from serve_helpers import LiveServer, chat_ids

    from dflash_mlx.serve.engine import Solo

    model, tok, draft = pairs("qwen3")
    chats = [[{"role": "user", "content": t}] for t in (PROMPT, "The quick brown fox")]
    texts: dict = {}
    kv = dict(kv_bits=8, kv_group_size=GROUP)
    with LiveServer(model, tok, draft, block_size=4, **kv) as s:
        assert isinstance(s.state.scheduler.engine.decoding, Solo)

        def ask(i):
            body = {"messages": chats[i], "max_tokens": N, "temperature": 0}
            r = httpx.post(f"{s.url}/v1/chat/completions", json=body, timeout=120)
            texts[i] = r.json()["choices"][0]["message"]["content"]

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    for i, chat in enumerate(chats):
        plain = stream_generate(
            model, None, tok, chat_ids(tok, chat), max_tokens=N, **kv
        )
        assert texts[i] == "".join(r.text for r in plain)


def test_a_chat_keeps_its_quantized_cache_across_turns(pairs):
    from dflash_mlx.chat import ChatSession, Settings

    model, tok, draft = pairs("qwen3")

    def answers(reuse: bool):
        settings = Settings(max_tokens=12, kv_bits=4, kv_group_size=GROUP)
        session = ChatSession(model, tok, draft, settings=settings, reuse_cache=reuse)
        out = []
        for text in ("hello there", "and then?"):
            out.append([t for c in session.stream(text) for t in c.response.tokens])
        assert all(isinstance(c, QuantizedKVCache) for c in session.cache.target)
        return out, session.turns[-1].reused_tokens

    warm, reused = answers(True)
    cold, _ = answers(False)
    assert warm == cold and reused > 0


def test_a_quantized_cache_prefills_in_chunks_that_shrink_as_the_context_grows(
    pairs, monkeypatch
):
    """Its attention materializes chunk x context scores: the chunks keep those near
    SCORES_BYTES; a float cache keeps the chunk asked for where its attention is tiled
    (the CPU's native blocks) and is bounded too where it is not (MLX's attention on
    the CPU backend). Same tokens either way."""
    from dflash_mlx.engine import prefill

    model, tok, draft = pairs("qwen3")
    target = as_target(model, draft)
    heads = target.query_heads
    assert heads == model.args.num_attention_heads
    float_cache = make_prompt_cache(model, draft)
    quantized = make_prompt_cache(model, draft, 8, GROUP)
    sizes = [prefill.chunk_size(target, quantized, 2048, c) for c in (0, 8192, 65536)]
    bounded = prefill.chunk_size(target, float_cache, 2048, 65536) < 2048
    assert bounded == (not target.cpu_blocks and mx.default_device() == mx.cpu)
    assert sizes[0] == 2048 and sizes[0] > sizes[1] > sizes[2] >= prefill.MIN_CHUNK
    assert 4 * heads * (8192 + 2048) * sizes[1] <= prefill.SCORES_BYTES

    ids = (tok.encode(PROMPT) * 12)[:300]
    kv = dict(kv_bits=8, kv_group_size=GROUP)
    whole = run(model, draft, tok, ids, prefill_step_size=512, **kv)
    whole_float = run(model, draft, tok, ids, prefill_step_size=512)
    monkeypatch.setattr(prefill, "SCORES_BYTES", 4 * heads * 600 * 40)
    monkeypatch.setattr(prefill, "MIN_CHUNK", 8)
    assert prefill.chunk_size(target, quantized, 512, 200) < 64
    assert run(model, draft, tok, ids, prefill_step_size=512, **kv) == whole
    assert run(model, draft, tok, ids, prefill_step_size=512) == whole_float
