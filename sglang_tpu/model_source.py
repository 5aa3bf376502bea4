"""Model sources: `hf://org/name[@revision]`, `gs://bucket/path`, `pvc://claim/path`, `/abs/path`.

`parse_model_source` validates the text the operator puts in `TPUSERVE_MODEL` (and
`TPUSERVE_SPECULATIVE_DRAFT_MODEL`); `local_path` says, without touching the disk or the
network, where the weights will be on this host; `fetch` makes that true.

Where weights land:

- ``hf://org/name@rev``: downloaded with `huggingface_hub.snapshot_download` into
  ``<weights cache>/hf/<org>/<name>/<rev or main>``; a restart with the same cache volume
  only checks that the files are there. The token comes from the environment variable named
  by `TPUSERVE_HF_TOKEN_ENV` and is never logged or printed.
- ``gs://bucket/path``: read in place from ``<gcs fuse root>/<bucket>/<path>`` when the
  operator mounted the bucket with the GCS FUSE CSI driver (`TPUSERVE_GCS_FUSE_ROOT`),
  otherwise downloaded with `google-cloud-storage` into ``<weights cache>/gcs/<bucket>/<path>``.
- ``pvc://claim/path``: the operator mounts the claim at ``/mnt/tpuserve/pvc/<claim>``
  (`pvc_mount_path`); read in place.
- ``/abs/path``: read in place (a hostPath, an image layer, a hand-run on a TPU VM).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

log = logging.getLogger(__name__)

Scheme = Literal["hf", "gs", "pvc", "local"]
PVC_MOUNT_ROOT = "/mnt/tpuserve/pvc"
ALLOWED_FORMS = "hf://org/name[@revision], gs://bucket/path, pvc://claim[/path] or an absolute path"

_HF_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_HF_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
_GCS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class ModelSourceError(ValueError):
    """Model source text that is not one of the allowed forms."""


@dataclass(frozen=True, slots=True)
class ModelSource:
    """One parsed model source; `location` is the repo id, bucket, claim or absolute path."""

    scheme: Scheme
    location: str
    path: str = ""  # object prefix (gs) or sub-directory (pvc); "" for the root
    revision: str | None = None  # hf only

    def __str__(self) -> str:
        if self.scheme == "hf":
            return f"hf://{self.location}" + (f"@{self.revision}" if self.revision else "")
        if self.scheme == "local":
            return self.location
        suffix = f"/{self.path}" if self.path else ""
        return f"{self.scheme}://{self.location}{suffix}"

    @property
    def default_served_name(self) -> str:
        """What clients put in `model` unless TPUSERVE_SERVED_MODEL_NAME says otherwise."""
        if self.scheme == "hf":
            return self.location
        last = PurePosixPath(self.path or self.location).name
        return last or self.location

    def local_path(self, weights_cache_dir: str | None, gcs_fuse_root: str | None) -> str:
        """Where the weights are (or will be after `fetch`) on this host."""
        if self.scheme == "local":
            return self.location
        if self.scheme == "pvc":
            return _join(pvc_mount_path(self.location), self.path)
        if self.scheme == "gs" and gcs_fuse_root is not None:
            return _join(gcs_fuse_root, self.location, self.path)
        if weights_cache_dir is None:
            raise ModelSourceError(f"{self} needs a weights cache directory")
        if self.scheme == "hf":
            return _join(weights_cache_dir, "hf", self.location, self.revision or "main")
        return _join(weights_cache_dir, "gcs", self.location, self.path)


def _join(*parts: str) -> str:
    return str(PurePosixPath(*[p for p in parts if p]))


def model_id(source: str) -> str:
    """The model's id inside a source (`hf://Qwen/Qwen3-8B@main` -> `Qwen/Qwen3-8B`): what
    the performance model and the HBM fit know a model by."""
    return source.split("://", 1)[-1].split("@", 1)[0]


def pvc_mount_path(claim: str) -> str:
    """Where the operator mounts a `pvc://claim/...` model's PersistentVolumeClaim."""
    return f"{PVC_MOUNT_ROOT}/{claim}"


def _clean_relative(path: str, text: str) -> str:
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ModelSourceError(f"{text!r}: '.' and '..' path segments are not allowed")
    return "/".join(parts)


def parse_model_source(text: str) -> ModelSource:
    """Parse one model source; raises ModelSourceError naming the allowed forms."""
    if text.startswith("hf://"):
        repo, _, revision = text[len("hf://") :].partition("@")
        parts = repo.split("/")
        if len(parts) != 2 or not all(_HF_PART.match(p) for p in parts):
            raise ModelSourceError(f"{text!r}: expected hf://org/name[@revision]")
        if revision and not _HF_REVISION.match(revision):
            raise ModelSourceError(f"{text!r}: revision {revision!r} is not a branch, tag or sha")
        if "@" in text and not revision:
            raise ModelSourceError(f"{text!r}: empty revision after '@'")
        return ModelSource("hf", repo, revision=revision or None)
    if text.startswith("gs://"):
        bucket, _, path = text[len("gs://") :].partition("/")
        if not _GCS_BUCKET.match(bucket):
            raise ModelSourceError(f"{text!r}: {bucket!r} is not a valid bucket name")
        cleaned = _clean_relative(path, text)
        if not cleaned:
            raise ModelSourceError(f"{text!r}: expected gs://bucket/path to a model directory")
        return ModelSource("gs", bucket, cleaned)
    if text.startswith("pvc://"):
        claim, _, path = text[len("pvc://") :].partition("/")
        if not _DNS_SUBDOMAIN.match(claim) or len(claim) > 253:
            raise ModelSourceError(f"{text!r}: {claim!r} is not a valid claim name")
        return ModelSource("pvc", claim, _clean_relative(path, text))
    if text.startswith("/"):
        return ModelSource("local", "/" + _clean_relative(text, text))
    raise ModelSourceError(f"{text!r} is not hf://, gs://, pvc:// or an absolute path")


# -- fetching -----------------------------------------------------------------------------

HfDownloader = Callable[[str, str | None, str, str | None], None]
GcsDownloader = Callable[[str, str, str], None]


def _hf_download(repo_id: str, revision: str | None, local_dir: str, token: str | None) -> None:
    from huggingface_hub import snapshot_download

    snapshot_download(repo_id=repo_id, revision=revision, local_dir=local_dir, token=token)


def _gcs_download(bucket: str, prefix: str, local_dir: str) -> None:
    """Copy every object under `prefix` into `local_dir`, skipping files of the same size."""
    from google.cloud import storage  # type: ignore[import-not-found,unused-ignore]

    client = storage.Client()
    found = False
    for blob in client.list_blobs(bucket, prefix=prefix.rstrip("/") + "/"):
        relative = blob.name[len(prefix.rstrip("/")) + 1 :]
        if not relative or relative.endswith("/"):
            continue
        found = True
        target = Path(local_dir, relative)
        if target.exists() and target.stat().st_size == blob.size:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        blob.download_to_filename(str(partial))
        partial.replace(target)
    if not found:
        raise FileNotFoundError(f"no objects under gs://{bucket}/{prefix}")


class FetchError(RuntimeError):
    """The weights of a model source could not be made available on this host."""


FETCHED_MARKER = ".tpuserve-fetched"


def fetch(
    source: ModelSource,
    weights_cache_dir: str | None,
    gcs_fuse_root: str | None,
    env: Mapping[str, str],
    hf_token_env: str,
    *,
    hf_download: HfDownloader = _hf_download,
    gcs_download: GcsDownloader = _gcs_download,
) -> str:
    """Make the weights of `source` available on this host and return their directory.

    Downloads go to the weights cache and are resumable: the HF hub skips files it already
    has, the GCS copy skips files of the right size and marks a finished copy, so a restarted
    container with the same cache volume starts without downloading again.
    """
    local_path = source.local_path(weights_cache_dir, gcs_fuse_root)
    if source.scheme == "hf":
        token = env.get(hf_token_env) or None
        log.info(
            "fetching %s into %s (token from $%s: %s)",
            source,
            local_path,
            hf_token_env,
            "set" if token else "unset",
        )
        try:
            hf_download(source.location, source.revision, local_path, token)
        except Exception as err:  # any hub or network error becomes one clear message
            raise FetchError(f"could not download {source}: {_redact(err, token)}") from None
        return local_path
    if source.scheme == "gs" and gcs_fuse_root is None:
        marker = Path(local_path, FETCHED_MARKER)
        if marker.exists():
            return local_path
        log.info("fetching %s into %s", source, local_path)
        try:
            gcs_download(source.location, source.path, local_path)
        except Exception as err:
            raise FetchError(f"could not download {source}: {err}") from None
        marker.touch()
        return local_path
    if not Path(local_path).is_dir():
        raise FetchError(f"{source}: {local_path} is not a directory on this host")
    return local_path


def _redact(err: BaseException, secret: str | None) -> str:
    text = str(err)
    return text.replace(secret, "<redacted>") if secret else text
