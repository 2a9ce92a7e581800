"""What fastermodels asks of the Hub, and what it says when the Hub cannot answer.

An offline session (``HF_HUB_OFFLINE=1`` or ``local_files_only=True``) asks the Hub nothing and
reads the huggingface_hub cache alone; a file the cache lacks is then
:class:`~fastermodels.ArtifactNotFoundError` naming the repo id, that the session is offline
and what to do, from :func:`load` and :meth:`FasterModel.from_pretrained` alike (huggingface_hub
itself raises its ``LocalEntryNotFoundError``, which says neither the id nor the way out).
"""

import os
import re
from collections.abc import Mapping
from typing import Any

from huggingface_hub import constants, hf_hub_download
from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

from fastermodels._errors import ArtifactNotFoundError

HUB_KEYS = ("revision", "token", "cache_dir", "force_download", "local_files_only")
# What the Hub accepts as a repo id: namespace/name, each of letters, digits, '-', '_', '.'
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


def _missing(repo: str, why: str) -> ArtifactNotFoundError:
    return ArtifactNotFoundError(f"{repo}: no such artifact folder ({why}); nothing was looked up on the Hub")


def is_local(repo_id: "str | os.PathLike[str]", repo: str) -> bool:
    """True for an artifact folder; False for a Hub repo id; a folder that is not there raises at once
    (``load`` and ``FasterModel.from_pretrained`` alike).

    A Hub look-up is only tried for a ``str`` of the Hub's ``namespace/name`` shape whose
    first part is not a local folder: a ``Path``, a bare name, an absolute or ``./`` path,
    or ``out/name`` beside an existing ``out/`` is a local path that does not exist.
    """
    if os.path.isdir(repo):
        return True
    if os.path.exists(repo):
        raise ArtifactNotFoundError(f"{repo}: is a file; an artifact is a folder (config.json, model.safetensors, ...)")
    if isinstance(repo_id, os.PathLike):
        raise _missing(repo, "a path object is never a Hub repo id")
    if not HUB_ID.fullmatch(repo) or ".." in repo or "--" in repo:
        raise _missing(repo, "nor a Hub repo id, which reads 'namespace/name'")
    namespace = repo.split("/")[0]
    if os.path.isdir(namespace):
        raise _missing(repo, f"{namespace}/ is a local folder, so this is taken as a path in it")
    return False


def offline(hub: Mapping[str, Any]) -> bool:
    """Whether Hub access ``hub`` (its ``local_files_only``) or the session is offline."""
    is_offline = getattr(constants, "is_offline_mode", None)
    return bool(hub.get("local_files_only")) or bool(
        is_offline() if callable(is_offline) else constants.HF_HUB_OFFLINE)


def not_cached(repo: str, missing: str, asked: bool) -> ArtifactNotFoundError:
    """The cache holds ``missing`` (e.g. 'no config.json') for ``repo``, and the Hub was not asked
    (offline: ``asked`` False) or could not be reached."""
    if not asked:
        return ArtifactNotFoundError(
            f"{repo}: offline (HF_HUB_OFFLINE=1 or local_files_only=True) and the huggingface_hub cache "
            f"holds {missing} for it; nothing was looked up on the Hub: load it once online, or pass the "
            "artifact's local folder")
    return ArtifactNotFoundError(
        f"{repo}: the Hub could not be reached and the huggingface_hub cache holds {missing} for it: "
        "check the connection (HF_ENDPOINT), or pass the artifact's local folder")


def download(repo: str, name: str, hub: Mapping[str, Any]) -> str:
    """``hf_hub_download`` of ``name``; a file neither the Hub nor the cache gives is
    :func:`not_cached`."""
    kwargs = {k: hub[k] for k in HUB_KEYS if k in hub}
    try:
        return str(hf_hub_download(repo_id=repo, filename=name, **kwargs))
    except LocalEntryNotFoundError:
        raise not_cached(repo, f"no {name}", not offline(hub)) from None


def hub_config(repo: str, hub: Mapping[str, Any]) -> str | None:
    """The cached path of a Hub repo's config.json, fetched as the mixin fetches it; None when the
    Hub has none (the mixin then reads no config, and ``_from_pretrained`` says so)."""
    try:
        return download(repo, "config.json", hub)
    except HfHubHTTPError:
        return None
