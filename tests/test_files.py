"""Atomic writes: all or nothing, and with the permissions the user expects."""

import os
import stat

import pytest

from dflash_mlx.files import atomic_path, write_text


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_a_new_file_gets_the_umask_mode_not_a_private_one(tmp_path, umask_022):
    out = write_text(tmp_path / "results.json", "{}")
    assert out.read_text() == "{}"
    assert _mode(out) == 0o644


def test_overwriting_keeps_the_file_own_mode(tmp_path, umask_022):
    out = tmp_path / "notes.md"
    out.write_text("old")
    out.chmod(0o640)
    write_text(out, "new")
    assert out.read_text() == "new"
    assert _mode(out) == 0o640


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    out = tmp_path / "plot.png"
    out.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(out) as tmp:
        tmp.write_text("half")
        raise RuntimeError("writer failed")
    assert out.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png"]
