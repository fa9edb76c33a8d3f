"""A tiny Hugging Face Hub on localhost, for `huggingface_hub` through HF_ENDPOINT.

It serves the routes `snapshot_download` uses (huggingface_hub 1.x):
- GET /api/models/{repo}/revision/{rev}: the repo's info (its commit `sha`);
- GET /api/models/{repo}/tree/{rev}: the file listing (one page);
- HEAD/GET /{repo}/resolve/{rev}/{file}: metadata headers (X-Repo-Commit, ETag,
  Content-Length) and the bytes, with `Range` requests answered 206.
Errors carry the Hub's X-Error-Code header, which is how huggingface_hub tells a
missing repo (RepoNotFound, 404), a gated one (GatedRepo, 401) and a missing file
(EntryNotFound, 404) apart. Knobs: `gated`, `missing` files, and `cut` to interrupt a
download: send the first n bytes of a file once and drop the connection, then serve the
client's retry (or, with `fail_retry`, answer it 500 once).
"""

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

INFO = re.compile(r"^/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?$")
TREE = re.compile(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?$")
RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


class FakeHub:
    """Serves `repos` {repo id: folder} until `close()`; `requests` logs what came."""

    def __init__(self, repos: dict[str, Path]):
        self.repos = {k: Path(v) for k, v in repos.items()}
        self.gated: set[str] = set()
        self.missing: set[tuple[str, str]] = set()  # listed, but 404 on download
        self.cut: dict[tuple[str, str], int] = {}  # send n bytes, then drop
        self.fail_retry = False  # the request after a cut gets a 500
        self.broken: set[tuple[str, str]] = set()
        self.requests: list[tuple[str, str, str | None]] = []  # method, path, Range
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def close(self):
        self._server.shutdown()
        self._server.server_close()

    def sha(self, repo: str) -> str:
        return hashlib.sha1(repo.encode()).hexdigest()  # 40 hex: a commit hash

    def files(self, repo: str) -> dict[str, Path]:
        root = self.repos[repo]
        return {
            str(f.relative_to(root)): f for f in sorted(root.rglob("*")) if f.is_file()
        }

    def downloads(self, name: str) -> list[tuple[str, str | None]]:
        """(method, Range) of each request for a file called `name`."""
        return [(m, r) for m, p, r in self.requests if p.endswith("/" + name)]


def _etag(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet: the tests read hub.requests
            pass

        def do_HEAD(self):
            self._route(body=False)

        def do_GET(self):
            self._route(body=True)

        def _route(self, body: bool):
            path = unquote(urlparse(self.path).path)
            hub.requests.append((self.command, path, self.headers.get("Range")))
            if m := TREE.match(path):
                return self._tree(m.group(1))
            if m := INFO.match(path):
                return self._info(m.group(1))
            if m := RESOLVE.match(path):
                return self._file(m.group(1), m.group(3), body)
            self._error(404, "RepoNotFound", "no such route")

        def _allowed(self, repo: str) -> bool:
            if repo not in hub.repos:
                self._error(404, "RepoNotFound", "Repository not found")
                return False
            if repo in hub.gated:
                self._error(401, "GatedRepo", "Access to this repo is restricted.")
                return False
            return True

        def _info(self, repo: str):
            if self._allowed(repo):
                siblings = [{"rfilename": name} for name in hub.files(repo)]
                self._json({"id": repo, "sha": hub.sha(repo), "siblings": siblings})

        def _tree(self, repo: str):
            if not self._allowed(repo):
                return
            entries = []
            for name, f in hub.files(repo).items():
                data = f.read_bytes()
                entry = {"type": "file", "path": name, "size": len(data)}
                entry["oid"] = hashlib.sha1(data).hexdigest()
                if name.endswith(".safetensors"):
                    entry["lfs"] = {
                        "oid": _etag(data),
                        "size": len(data),
                        "pointerSize": 134,
                    }
                entries.append(entry)
            self._json(entries)

        def _file(self, repo: str, name: str, body: bool):
            if not self._allowed(repo):
                return
            f = hub.files(repo).get(name)
            if f is None or (repo, name) in hub.missing:
                return self._error(404, "EntryNotFound", f"{name} does not exist")
            data = f.read_bytes()
            start = _range_start(self.headers.get("Range"))
            if body and (repo, name) in hub.cut:
                return self._cut(repo, name, data)
            if body and (repo, name) in hub.broken:
                hub.broken.discard((repo, name))
                return self._error(500, None, "the server broke down")
            part = data[start:]
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", hub.sha(repo))
            self.send_header("ETag", f'"{_etag(data)}"')
            self.send_header("Content-Length", str(len(part)))
            self.send_header("Accept-Ranges", "bytes")
            if start:
                self.send_header(
                    "Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}"
                )
            self.end_headers()
            if body:
                self.wfile.write(part)

        def _cut(self, repo: str, name: str, data: bytes):
            """Send the first n bytes of the whole file and drop the connection."""
            n = hub.cut.pop((repo, name))
            if hub.fail_retry:
                hub.broken.add((repo, name))
            self.send_response(200)
            self.send_header("X-Repo-Commit", hub.sha(repo))
            self.send_header("ETag", f'"{_etag(data)}"')
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[:n])
            self.wfile.flush()
            self.close_connection = True

        def _json(self, value):
            data = json.dumps(value).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, code: str | None, message: str):
            data = json.dumps({"error": message}).encode()
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

    return Handler


def _range_start(header: str | None) -> int:
    m = re.match(r"bytes=(\d+)-", header or "")
    return int(m.group(1)) if m else 0
