"""A model named by its Hugging Face id (``--model Qwen/Qwen3-0.6B --revision ...``), resolved to a directory.

Through ``huggingface_hub.snapshot_download``, so its cache (``HF_HOME`` / ``HF_HUB_CACHE``), its offline mode
(``HF_HUB_OFFLINE=1``: the cache only, no request), its token (``HF_TOKEN``) and its endpoint (``HF_ENDPOINT``: a
mirror or a private hub) mean what they mean for ``vllm serve``. The endpoint is read when a model is resolved,
not when huggingface_hub is imported, so a caller that sets it late still reaches it.

huggingface_hub itself is imported only when a model is resolved: every worker and ``meshfront run`` import
this module for its flag checks, and most of them (``--model-dir``, the mocker) never name a hub model.
"""

from __future__ import annotations

import os
import re

# What a hub id looks like: "name" or "org/name" (no path: a directory is --model-dir).
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


class ModelNotResolved(ValueError):
    """The id cannot be turned into a directory; the message says why, on one line."""


def model_flag_errors(model: str, model_dir: str, revision: str) -> list[str]:
    """What is wrong with --model / --model-dir / --revision together (a worker's flags and `meshfront run`'s)."""
    errors = []
    if model and model_dir:
        errors.append("--model and --model-dir both name the model: give one")
    if revision and not model:
        errors.append("--revision needs --model (a Hugging Face id)")
    return errors


def is_hub_id(name: str) -> bool:
    return bool(_HUB_ID.match(name)) and ".." not in name


def resolve_model(model: str, revision: str = "", *, cache_dir: str | None = None) -> str:
    """The local snapshot directory of ``model`` at ``revision`` (default: the repository's default branch),
    downloaded into the Hugging Face cache unless it is there already."""
    if not is_hub_id(model):
        raise ModelNotResolved(f"--model {model!r} is not a Hugging Face id (org/name); a directory is --model-dir")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return str(snapshot_download(model, revision=revision or None, cache_dir=cache_dir,
                                     endpoint=os.environ.get("HF_ENDPOINT") or None))
    except (RepositoryNotFoundError, GatedRepoError) as e:  # the hub answers 401 for both unknown and private
        raise ModelNotResolved(f"model {model!r} is not on the hub or needs a token (HF_TOKEN): "
                               f"{_first_line(e)}") from None
    except RevisionNotFoundError:
        raise ModelNotResolved(f"model {model!r} has no revision {revision!r}") from None
    except LocalEntryNotFoundError as e:
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        why = "HF_HUB_OFFLINE is set and it is not in the cache" if offline else _first_line(e)
        raise ModelNotResolved(f"model {model!r} cannot be downloaded: {why}") from None


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
