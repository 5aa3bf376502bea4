"""The committed recording of SGLang-JAX's answers is what the built engine answers now.

CI holds the twin's SGLang-JAX flavour to `tests/goldens/sglang_jax_recorded.json`; where the
build is present, this records the fixed requests again on a fresh engine and compares each
exchange's status, kind of answer and token counts (prompt, completion, cached) with the
committed file, so a stale recording fails here rather than holding the twin to old answers.
"""

from __future__ import annotations

import pytest

from tests.component.differential import sglang_jax_recorded as recorded
from tests.real_sglang_jax import SGLangJax

pytestmark = [pytest.mark.component, pytest.mark.real_sglang_jax]


def test_the_engine_answers_as_recorded(real_sglang_jax: SGLangJax) -> None:
    committed = recorded.load()
    assert committed["engine"]["commit"] == real_sglang_jax.commit, (
        f"recorded with {committed['engine']['commit']}, built {real_sglang_jax.commit}: "
        f"re-record with {recorded.RERECORD}"
    )
    fresh = recorded.record()
    found = recorded.differences(committed["exchanges"], fresh["exchanges"])
    assert not found, f"re-record with {recorded.RERECORD}:\n" + "\n".join(found)
    assert fresh["engine"]["args"] == committed["engine"]["args"]
