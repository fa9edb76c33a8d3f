import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import tiny  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def user_cache(tmp_path_factory):
    """The suite's own user cache (block timings, the unpacked default drafter), so
    tests never read or leave files in the real one; CLI subprocesses inherit it."""
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("user-cache"))
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
