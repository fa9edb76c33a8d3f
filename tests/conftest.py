import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# the examples' scripted agent (examples/scripted_agent.py) is tested here too
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "examples"))

import tiny  # noqa: E402
from caches import with_native_builds  # noqa: E402

from dflash_mlx import backend  # noqa: E402

# The lossless core: what `--kernels=mlx` (make test-generic) runs again on MLX's
# generic kernels, the ones a Mac's GPU runs. Node id prefixes under tests/.
LOSSLESS_CORE = (
    "test_families.py::test_lossless_at_every_block_size",  # every family
    "test_families.py::test_quantized_family_is_lossless[qwen3_5]",
    "test_families.py::test_quantized_family_is_lossless[gemma4]",
    "test_families.py::test_a_muse_glimmer_dflash2_drafter_is_lossless",
    "test_families.py::test_the_run_uses_the_chosen_kernels",
    "test_target.py::test_rollback_equals_fresh_run",
    "test_target.py::test_logits_match_the_model",
    "test_generate.py::test_forced_acceptance_patterns[full-qwen3_5]",
    "test_generate.py::test_forced_acceptance_patterns[none-qwen3_5]",
    "test_generate.py::test_forced_acceptance_patterns[full-gemma4_text]",
    "test_generate.py::test_prompt_cache_reuse_matches_fresh_runs",
    "test_sampling.py::test_sampled_generation_matches_target_distribution[qwen3_5-",
    "test_dflash2.py::",
    "test_fuzz.py::",
    "test_reference.py::test_block_by_block_acceptance_matches_reference",
    "test_serve_openai.py::test_greedy_chat_equals_generate_streamed_or_not",
    "test_serve_anthropic.py::test_messages_equal_generate",
    "test_serve_anthropic.py::test_responses_equal_generate_streamed_or_not",
    "test_distributed.py::test_greedy_on_two_ranks_equals_plain_decoding[qwen3_5-",
    "test_exactness.py::",
    "test_processors.py::test_greedy_processed_equals_plain_decoding",
    "test_processors.py::test_batched_greedy_processed_equals_plain_decoding",
    "test_structured.py::test_greedy_constrained_equals_plain_constrained",
    "test_structured.py::test_batched_greedy_constrained_equals_plain_constrained",
    # prefill chunks bounded where attention materializes scores (the CPU's MLX path)
    "test_kv_quantized.py::test_a_quantized_cache_prefills_in_chunks",
    "test_sliding_cache.py::test_lossless_and_bounded_far_past_window_and_slack",
)


def pytest_addoption(parser):
    parser.addoption(
        "--kernels",
        choices=backend.KERNEL_CHOICES,
        default="device",
        help="'mlx': run the lossless core on MLX's generic kernels (the Mac's path).",
    )


def generic_kernels(config) -> bool:
    return config.getoption("kernels") != "device"


def pytest_collection_modifyitems(config, items):
    """On the generic kernels, only the lossless core runs (deselected otherwise)."""
    if not generic_kernels(config):
        return
    names = [item.nodeid.split("tests/", 1)[-1] for item in items]
    files = {name.split("::")[0] for name in names}
    stale = [
        p
        for p in LOSSLESS_CORE
        if p.split("::")[0] in files and not any(n.startswith(p) for n in names)
    ]
    if stale:  # a renamed test would otherwise leave the generic run quietly
        raise pytest.UsageError(
            f"LOSSLESS_CORE names tests that do not exist: {stale}. Fix: update it "
            "in tests/conftest.py."
        )
    keep = [i for i, n in zip(items, names, strict=True) if n.startswith(LOSSLESS_CORE)]
    config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    items[:] = keep


@pytest.fixture(scope="session", autouse=True)
def chosen_kernels(request):
    """`--kernels=mlx`: every target and drafter the run builds, in this process and
    its server threads, runs on MLX's generic kernels (`backend.forced`)."""
    chosen = backend.named(request.config.getoption("kernels"))
    if chosen is None:
        yield None
        return
    with backend.forced(chosen):
        yield chosen


@pytest.fixture(scope="session")
def kernels_args(request) -> list[str]:
    """The CLI arguments that pass the run's `--kernels` to a subprocess."""
    name = request.config.getoption("kernels")
    return [] if name == "device" else ["--kernels", name]


@pytest.fixture(scope="session", autouse=True)
def user_cache(tmp_path_factory):
    """The suite's own user cache (block timings, the unpacked default drafter), so
    tests never read or leave files in the real one; CLI subprocesses inherit it.
    Only the native kernels' builds are shared between runs (caches.py)."""
    saved = os.environ.get("XDG_CACHE_HOME")
    fresh = with_native_builds(tmp_path_factory.mktemp("user-cache"))
    os.environ["XDG_CACHE_HOME"] = str(fresh)
    yield Path(os.environ["XDG_CACHE_HOME"])
    if saved is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = saved


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_pair(models_dir):
    """(target_dir, draft_dir) per family, built once per session."""
    built = {}

    def get(family, **draft_kwargs):
        key = (family, tuple(sorted(draft_kwargs.items())))
        if key not in built:
            t = models_dir / f"{family}-target"
            if not t.exists():
                tiny.make_target(t, family)
            name = "-".join(f"{k}{v}" for k, v in sorted(draft_kwargs.items()))
            d = tiny.make_draft(models_dir / f"{family}-draft{name}", t, **draft_kwargs)
            built[key] = (t, d)
        return built[key]

    return get
