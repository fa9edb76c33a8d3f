"""ChatSession: templates, thinking, cache reuse, interrupts, commands, transcripts."""

import json

import pytest
import tiny

from dflash_mlx import load, load_draft
from dflash_mlx.chat import ChatSession, Piece, Settings
from dflash_mlx.chat.turn import ThinkTracker
from dflash_mlx.conversation import split_thinking
from dflash_mlx.generate import GenerationResponse


@pytest.fixture(scope="module")
def pair(tiny_pair):
    t, d = tiny_pair("qwen3")
    model, tokenizer = load(str(t))
    return model, tokenizer, load_draft(str(d), target=model)


def session(pair, **kw):
    model, tokenizer, draft = pair
    kw.setdefault("settings", Settings(max_tokens=12))
    return ChatSession(
        model, tokenizer, draft, names={"model": "tiny", "draft": "tiny-d"}, **kw
    )


def run(s, text):
    chunks = list(s.stream(text))
    return "".join(c.text for c in chunks), chunks


def cache_consistent(s):
    n = len(s.cache.tokens)
    return all(c.offset == n for c in s.cache.target + s.cache.draft)


def test_pieces_match_engine_text_and_history(pair):
    s = session(pair, system="Be brief.")
    text, chunks = run(s, "hello there")
    assert text == "".join(c.response.text for c in chunks)
    assert [m["role"] for m in s.messages] == ["user", "assistant"]
    assert s.messages[1]["content"] == text
    st = s.turns[0]
    assert st.generation_tokens == 12 and st.finish_reason == "length"
    assert st.mode == "dflash" and st.block_size == "auto"
    assert st.blocks == len(chunks) - 1 and st.mean_accepted >= 1
    assert "<|im_start|>system\nBe brief.<|im_end|>" in s.render_text()


def test_second_turn_reuses_the_cache_and_matches_a_fresh_prefill(pair):
    reuse, fresh = session(pair), session(pair, reuse_cache=False)
    for s in (reuse, fresh):
        run(s, "first question")
    cached = reuse.cached_tokens
    a, _ = run(reuse, "a follow-up")
    b, _ = run(fresh, "a follow-up")
    assert a == b  # reuse is lossless
    first, second = reuse.turns
    # the whole first exchange came from the cache: the answer keeps its generated ids
    assert (
        second.reused_tokens
        == cached
        == first.prompt_tokens + first.generation_tokens - 1
    )
    assert fresh.turns[1].reused_tokens == 0
    assert cache_consistent(reuse)


def test_close_mid_answer_keeps_partial_answer_marked(pair):
    s = session(pair, settings=Settings(max_tokens=40))
    gen = s.stream("tell me a story")
    got = [next(gen).text for _ in range(3)]
    gen.close()
    last = s.messages[-1]
    assert last["interrupted"] is True and last["content"] == "".join(got)
    assert s.turns[-1].finish_reason == "interrupted"
    assert cache_consistent(s)
    cached = s.cached_tokens
    text, _ = run(s, "go on")
    assert s.turns[-1].reused_tokens == cached > s.turns[0].prompt_tokens
    assert s.messages[-1]["content"] == text and "interrupted" not in s.messages[-1]


def test_keyboard_interrupt_inside_the_engine(pair):
    s = session(pair, settings=Settings(max_tokens=40))
    gen = s.stream("tell me a story")
    next(gen)
    with pytest.raises(KeyboardInterrupt):
        gen.throw(KeyboardInterrupt)
    assert s.messages[-1]["interrupted"] is True
    assert cache_consistent(s)
    run(s, "again")
    assert s.turns[-1].finish_reason == "length"


def test_prompt_longer_than_context_is_refused_before_any_work(pair):
    s = session(pair)
    s.context = 40
    with pytest.raises(ValueError, match="context is 40"):
        s.stream("x" * 100)
    assert s.messages == [] and s.cached_tokens == 0
    s.context = 60  # room left for fewer tokens than max_tokens: answers are cut to fit
    s.settings.max_tokens = 100
    run(s, "hi")
    assert s.turns[0].prompt_tokens + s.turns[0].generation_tokens <= 60


def test_engine_error_drops_the_turn_and_the_chat_goes_on(pair):
    s = session(pair)
    s.settings.top_p = 5.0  # SamplingParams rejects it inside the engine
    with pytest.raises(ValueError, match="top_p"):
        run(s, "hello")
    assert s.messages == []
    s.settings.top_p = 1.0
    run(s, "hello")
    assert len(s.messages) == 2


def test_slash_commands_change_state(pair, tmp_path):
    s = session(pair)
    assert s.command("/help")[0] == "help" and s.command("/stats")[0] == "stats"
    assert s.command("/exit")[0] == "exit"
    s.command("/temp 0.7")
    assert s.settings.temperature == 0.7
    s.command("/temp 0")
    s.command("/max 7")
    assert s.settings.max_tokens == 7
    s.command("/max 12")
    for bad in (
        "/temp x",
        "/temp -1",
        "/block 0",
        "/draft maybe",
        "/nope",
        "/save",
        "/max 0",
    ):
        with pytest.raises(ValueError):
            s.command(bad)
    s.command("/block 4")
    assert s.block_size == 4 and s.mode == "dflash"
    s.command("/color on")
    assert s.settings.color
    run(s, "one")
    s.command("/draft off")
    assert s.mode == "plain" and s.block_size == 1
    run(s, "two")
    s.command("/draft on")
    run(s, "three")
    modes = [(t.mode, t.block_size) for t in s.turns]
    assert modes == [("dflash", 4), ("plain", 1), ("dflash", 4)]
    # plain turns keep the drafter's cache in sync: every turn reuses the history
    assert all(t.reused_tokens > 0 for t in s.turns[1:])
    assert cache_consistent(s)
    assert s.turns[2].speedup == pytest.approx(
        s.turns[2].generation_tps / s.turns[1].generation_tps
    )
    stats = s.stats()
    assert (
        stats["turns"] == 3
        and stats["generated_tokens"] == 36
        and stats["plain_tps"] > 0
    )
    assert stats["cached_tokens"] == s.cached_tokens > 0

    s.command(f"/save {tmp_path / 'chat.json'}")
    data = json.loads((tmp_path / "chat.json").read_text())
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"] * 3
    assert data["model"] == "tiny" and data["messages"][1]["stats"]["mode"] == "dflash"
    s.command(f"/save {tmp_path / 'chat.md'}")
    md = (tmp_path / "chat.md").read_text()
    assert md.count("## User") == 3 and "## Assistant" in md and "plain" in md

    assert s.command("/reset")[0] == "info"
    assert s.messages == [] and s.cached_tokens == 0


def test_draft_commands_without_a_drafter(pair):
    model, tokenizer, _ = pair
    s = ChatSession(model, tokenizer, None, settings=Settings(max_tokens=4))
    with pytest.raises(ValueError, match="--draft"):
        s.command("/draft on")
    with pytest.raises(ValueError, match="--draft"):
        s.command("/block 8")
    run(s, "hi")
    assert s.turns[0].mode == "plain"


def response(texts, from_draft, finish=None):
    tokens = list(range(len(texts)))
    return GenerationResponse(
        "".join(texts),
        tokens,
        len(tokens),
        1,
        1.0,
        1,
        1.0,
        0.0,
        finish,
        from_draft,
        token_texts=texts,
    )


def test_pieces_mark_drafted_tokens_and_thinking():
    tracker = ThinkTracker(thinking=False)
    assert tracker.pieces(response(["<think>", "hm"], 1)) == [
        Piece("<think>", True, True),
        Piece("hm", False, True),
    ]
    assert tracker.pieces(response(["</think>", "Hi", "!"], 2)) == [
        Piece("</think>", True, True),
        Piece("Hi", True, False),
        Piece("!", False, False),
    ]
    # a stop token has no text and makes no piece
    assert tracker.pieces(response(["!", ""], 1, "stop")) == [Piece("!", True, False)]
    # one token's text holding a whole <think>...</think> and the answer after it
    assert ThinkTracker(False).pieces(response(["<think>a</think>b"], 0)) == [
        Piece("<think>", False, True),
        Piece("a</think>", False, True),
        Piece("b", False, False),
    ]
    tracker = ThinkTracker(thinking=True)  # the template opened <think> in the prompt
    assert tracker.pieces(response(["hm", "</think>", "Hi"], 0))[0] == Piece(
        "hm", False, True
    )


def test_token_texts_join_to_the_response_text(pair):
    model, tokenizer, draft = pair
    from dflash_mlx import stream_generate

    responses = list(
        stream_generate(model, draft, tokenizer, "héllo wörld", max_tokens=20)
    )
    for r in responses:
        assert len(r.token_texts) == len(r.tokens)
        assert "".join(r.token_texts) == r.text
    # the same text as mlx-lm's streaming detokenizer fed the same tokens one by one
    detokenizer = tokenizer.detokenizer
    streamed = []
    for t in [t for r in responses for t in r.tokens]:
        if t not in tokenizer.eos_token_ids:
            detokenizer.add_token(t)
            streamed.append(detokenizer.last_segment)
    detokenizer.finalize()
    streamed.append(detokenizer.last_segment)
    assert "".join(r.text for r in responses) == "".join(streamed)


def test_split_thinking():
    assert split_thinking("<think>\nhmm\n</think>\n\nYes.") == ("hmm", "Yes.")
    assert split_thinking("Yes.") == ("", "Yes.")
    assert split_thinking("<think>still going") == ("still going", "")


def test_qwen3_template_thinking_switch(models_dir):
    path = models_dir / "qwen3-real-tok"
    if not path.exists():
        tiny.make_target(path, "qwen3", vocab_size=151936, tokenizer="qwen3")
    model, tokenizer = load(str(path))
    on = ChatSession(model, tokenizer, thinking=True, settings=Settings(max_tokens=3))
    off = ChatSession(model, tokenizer, thinking=False, settings=Settings(max_tokens=3))
    assert on.thinking_supported and off.thinking_supported
    msgs = [{"role": "user", "content": "2+2?"}]
    assert off.render_text(msgs).endswith("<think>\n\n</think>\n\n")
    assert on.render_text(msgs).endswith("<|im_start|>assistant\n")
    # earlier answers lose their <think> part when re-rendered, as the template says
    off.messages = msgs + [
        {"role": "assistant", "content": "<think>\nsecret\n</think>\n\nFour."}
    ]
    assert (
        "secret" not in off.render_text(off.messages + msgs)
        and "Four." in off.render_text()
    )
    text, chunks = run(off, "hello")
    assert (
        chunks[-1].stats.generation_tokens == 3 and off.messages[-1]["content"] == text
    )


def test_byte_template_has_no_thinking_switch(pair):
    assert not session(pair).thinking_supported


def test_turn_stats_say_what_the_engine_did(pair):
    s = session(pair, settings=Settings(max_tokens=24))
    run(s, "hello")
    st = s.turns[-1]
    # every block after the first token is counted once: drafted (by its source) or
    # plain, at the size the target verified
    assert st.blocks == sum(st.sizes.values()) == st.drafted_blocks + st.plain_blocks
    assert st.drafted_blocks == sum(st.sources.values())
    assert st.last_block_size is not None
    s.command("/block 4")  # a fixed size drafts every block the budget allows
    run(s, "again")
    st = s.turns[-1]
    assert set(st.sources) == {"draft"} and max(st.sizes) == 4
    assert st.plain_blocks == st.sizes.get(1, 0)
    s.command("/draft off")
    run(s, "plain now")
    assert s.turns[-1].drafted_blocks == 0 and s.turns[-1].mode == "plain"
    totals = s.stats()
    assert totals["blocks"] == sum(t.blocks for t in s.turns[:2])  # DFlash turns
    assert totals["drafted_blocks"] == sum(t.drafted_blocks for t in s.turns)


def test_render_and_color_commands(pair):
    s = session(pair)
    assert s.settings.markdown and not s.settings.color
    assert s.command("/render off") == ("info", "Answers as raw text.")
    assert not s.settings.markdown
    s.command("/render on")
    assert "raw text" in s.command("/color on")[1]  # colours show on raw text
    assert "/color is off" in s.command("/render on")[1]
    with pytest.raises(ValueError, match="/render on"):
        s.command("/render maybe")
