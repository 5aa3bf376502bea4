"""Stand-in for ``pathwaysutils`` on the TPU lane (docs/tpu-lane.md, SGLang-JAX).

SGLang-JAX's scheduler imports ``pathwaysutils`` unconditionally and calls it only under
``JAX_PLATFORMS=proxy`` (Pathways); the real package imports orbax-checkpoint and tensorstore,
which the lane does not carry. This stand-in keeps the import working and refuses the call.
"""


def initialize() -> None:
    raise RuntimeError("pathwaysutils stand-in: Pathways (JAX_PLATFORMS=proxy) is not supported")
