"""Hugging Face Hub ids and local folders to a local path, with fix-it errors.

The Hub is the normal path for real users (`snapshot_download` into the Hugging Face
cache); every way it fails is turned into a `ValueError` that names the repo, the cache
and the command that fixes it. tests/test_hub.py drives it against a fake Hub.
"""

import os
from pathlib import Path


def _check_name(path_or_repo, what: str) -> str:
    if not isinstance(path_or_repo, (str, os.PathLike)) or not str(path_or_repo):
        raise ValueError(
            f"{what} must be a folder path or a Hugging Face repo id (owner/name), "
            f"got {path_or_repo!r}."
        )
    return str(path_or_repo)


def resolve_path(path_or_repo: str, patterns: list[str], what: str = "model") -> Path:
    """A local folder as-is, or a Hugging Face repo id downloaded (or cached)."""
    path_or_repo = _check_name(path_or_repo, what)
    path = Path(path_or_repo).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ValueError(
                f"{what} path '{path}' is a file; pass the folder that holds "
                "config.json."
            )
        return path
    if path_or_repo.startswith((".", "/", "~")) or path_or_repo.count("/") != 1:
        raise ValueError(
            f"{what} '{path_or_repo}' is neither an existing folder nor a Hugging Face "
            "repo id "
            "(owner/name). Check the path or the repo id."
        )
    return _download(path_or_repo, patterns, what)


def _download(repo: str, patterns: list[str], what: str) -> Path:
    """`snapshot_download` of `repo`, its errors turned into fix-it ValueErrors."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache = constants.HF_HUB_CACHE
    try:
        return Path(snapshot_download(repo, allow_patterns=patterns))
    except GatedRepoError as e:
        raise ValueError(
            f"{what} '{repo}' is gated on the Hugging Face Hub: accept its licence on "
            f"https://huggingface.co/{repo} and log in with `hf auth login`."
        ) from e
    except RepositoryNotFoundError as e:
        raise ValueError(
            f"{what} '{repo}' was not found on the Hugging Face Hub: check the repo "
            "id (a private repo needs `hf auth login`)."
        ) from e
    except LocalEntryNotFoundError as e:
        why = (
            "HF_HUB_OFFLINE is set"
            if constants.HF_HUB_OFFLINE
            else "the Hugging Face Hub cannot be reached"
        )
        raise ValueError(
            f"{what} '{repo}' is not in the local Hugging Face cache and {why}: "
            f"download it once with network access (`hf download {repo}`), or pass "
            f"a local folder (cache: {cache})."
        ) from e
    except (EntryNotFoundError, RevisionNotFoundError) as e:
        raise ValueError(
            f"{what} '{repo}': a file it lists cannot be downloaded from the Hub "
            f"({_first_line(e)}); the repo may be broken: try again later or pass a "
            f"local folder (the cache is {cache})."
        ) from e
    except (HfHubHTTPError, OSError) as e:
        raise ValueError(
            f"{what} '{repo}' could not be downloaded ({_first_line(e)}): check the "
            f"connection and run the same command again (the cache is {cache})."
        ) from e


def _first_line(error: Exception) -> str:
    """The error's message on one line (the Hub's span several)."""
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    return (text or type(error).__name__)[:300]
