"""Container images as local commands: what the pod runner runs for an image reference.

tpuserve's images all run the `tpuserve` command (Dockerfile, sglang_tpu/Dockerfile); here
that is this Python environment's own `tpuserve`, so a pod runs the code the runner runs. An
image is known by its repository, whatever its tag or digest. Like a container runtime, the
image gives the entrypoint and default arguments, which a container's `command` and `args`
replace, and the directories its PATH searches; `/opt/tpuserve/bin` of the images is this
environment's bin directory.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tpuserve_operator.render.context import (
    DEFAULT_ENGINE_IMAGE,
    DEFAULT_IMAGE,
    DEFAULT_SGLANG_JAX_IMAGE,
)

BIN_DIR = Path(sys.executable).parent
SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")


@dataclass(frozen=True, slots=True)
class LocalImage:
    """What an image runs: entrypoint, default arguments, environment, PATH directories."""

    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    path: tuple[str, ...] = (str(BIN_DIR), *SYSTEM_PATH)
    # Set after the pod's own environment: what stands in for a device this machine lacks.
    overrides: Mapping[str, str] = field(default_factory=dict)
    # Variables holding model sources the image's launcher reads: a `pvc://CLAIM/PATH` among
    # them becomes the path it names (/mnt/tpuserve/pvc/CLAIM/PATH, the claim's mountPath),
    # localized like any path under a mount, since the launcher derives it out of sight.
    model_sources: tuple[str, ...] = ()

    def argv(self, command: list[str] | None, args: list[str] | None) -> list[str]:
        """Docker's rule: `command` replaces the entrypoint, `args` the default arguments."""
        if command:
            return [*command, *(args or [])]
        return [*self.entrypoint, *(self.cmd if args is None else args)]

    def resolve(self, program: str) -> str | None:
        """The executable `program` names, searched on the image's PATH like exec does."""
        if "/" in program:
            return program if Path(program).exists() else None
        return shutil.which(program, path=":".join(self.path))


def repository(image: str) -> str:
    """`ghcr.io/tpuserve/tpuserve` for `ghcr.io/tpuserve/tpuserve:0.1@sha256:...`."""
    name = image.split("@", 1)[0]
    last_slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > last_slash else name


_IMAGE_ENV = {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/tmp"}

IMAGES: Mapping[str, LocalImage] = {
    # The plain image (Dockerfile): operator, router and engine twin.
    repository(DEFAULT_IMAGE): LocalImage(("tpuserve",), ("--help",), _IMAGE_ENV),
    # The TPU engine image (sglang_tpu/Dockerfile): `tini -- tpuserve engine launch`.
    repository(DEFAULT_ENGINE_IMAGE): LocalImage(("tpuserve", "engine", "launch"), (), _IMAGE_ENV),
}


SGLANG_JAX_IMAGE = repository(DEFAULT_SGLANG_JAX_IMAGE)


class UnknownImage(LookupError):
    """An image with no local command; the container waits with reason ErrImagePull."""

    def __init__(self, image: str, why: str | None = None) -> None:
        known = ", ".join(sorted([*IMAGES, SGLANG_JAX_IMAGE]))
        super().__init__(
            why or f"image {image!r} has no local command; the pod runner runs: {known} (any tag)"
        )


def sglang_jax_image(image: str) -> LocalImage:
    """`tpuserve engine launch` on the cpu device with the opt-in SGLang-JAX build."""
    from tpuserve.up.errors import UpError
    from tpuserve.up.sglang_jax import find_build

    try:
        build = find_build()
    except UpError as err:
        why = f"image {image!r}: SGLang-JAX on CPU stands in for it here: {err}"
        raise UnknownImage(image, why) from None
    env = {
        **_IMAGE_ENV,
        "TOKENIZERS_PARALLELISM": "false",
        # compiled batch shapes kept across pods and runs, shared with `tpuserve up`
        "JAX_COMPILATION_CACHE_DIR": str(build.python.parents[2] / "jax-cache"),
    }
    overrides = {"TPUSERVE_DEVICE": "cpu", "TPUSERVE_SGLANG_PYTHON": str(build.python)}
    sources = ("TPUSERVE_MODEL", "TPUSERVE_SPECULATIVE_DRAFT_MODEL")
    return LocalImage(
        ("tpuserve", "engine", "launch"), (), env, overrides=overrides, model_sources=sources
    )


def local_image(image: str) -> LocalImage:
    name = repository(image)
    if name == SGLANG_JAX_IMAGE:
        return sglang_jax_image(image)
    found = IMAGES.get(name)
    if found is None:
        raise UnknownImage(image)
    return found
