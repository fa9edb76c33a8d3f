"""User cache folders for the suite: fresh for each run (timings, history, the unpacked
drafter), but with the native CPU kernels' builds shared between runs, pytest-xdist
workers and the CLI processes the tests start. A build's folder is keyed by everything
the binary depends on (dflash_mlx/cpu/native), so sharing one is what a user's cache
does; it saves a 20-second compile in every process that starts on a fresh cache."""

from pathlib import Path

# kept between runs (git ignores /.cache/); `make clean` removes it
NATIVE_BUILDS = Path(__file__).resolve().parents[1] / ".cache" / "test-native-builds"


def with_native_builds(cache: Path) -> Path:
    """`cache` (an XDG_CACHE_HOME), set up to find the shared native builds."""
    folder = cache / "dflash-mlx"
    folder.mkdir(parents=True, exist_ok=True)
    NATIVE_BUILDS.mkdir(parents=True, exist_ok=True)
    link = folder / "native"
    if not link.is_symlink() and not link.exists():
        link.symlink_to(NATIVE_BUILDS, target_is_directory=True)
    return cache
