"""The prefix-aware router: SGLang's and OpenAI's API in front of the model-server replicas."""

import logging

from tpuserve_router import compiled as _compiled


def _use_the_checkouts_build() -> None:
    """Put a checkout's compiled modules first on the package's path, if they are fresh."""
    if not _compiled.BUILD_DIR.is_dir():  # an installed wheel, or a checkout never built
        return
    reason = _compiled.stale_reason()
    if reason is None:
        __path__.insert(0, str(_compiled.BUILD_DIR / "tpuserve_router"))
    else:
        logging.getLogger(__name__).warning(
            "the router runs interpreted: its compiled build in %s is stale (%s); "
            "`python scripts/build_native.py` rebuilds it",
            _compiled.BUILD_DIR,
            reason,
        )


_use_the_checkouts_build()
