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

from tpuserve_operator.render.context import DEFAULT_ENGINE_IMAGE, DEFAULT_IMAGE

BIN_DIR = Path(sys.executable).parent
SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")


@dataclass(frozen=True, slots=True)
class LocalImage:
    """What an image runs: entrypoint, default arguments, environment, PATH directories."""

    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    path: tuple[str, ...] = (str(BIN_DIR), *SYSTEM_PATH)

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


class UnknownImage(LookupError):
    """An image with no local command; the container waits with reason ErrImagePull."""

    def __init__(self, image: str) -> None:
        super().__init__(
            f"image {image!r} has no local command; the pod runner runs: "
            f"{', '.join(sorted(IMAGES))} (any tag)"
        )


def local_image(image: str) -> LocalImage:
    found = IMAGES.get(repository(image))
    if found is None:
        raise UnknownImage(image)
    return found
