"""bench/sgl_jax_host_tier_live.py: its workload (every document asked every question once, in
one seeded order, ids of the tiny model's vocabulary, documents sharing no prefix) and its
working set against the fleet's pool."""

from __future__ import annotations

import pytest

from bench.sgl_jax_host_tier_live import QUESTION_TOKENS, TOKEN_IDS, Workload

pytestmark = pytest.mark.unit


def test_every_document_is_asked_every_question_in_a_seeded_order() -> None:
    workload = Workload(docs=4, doc_tokens=64, questions=3, concurrency=2, seed=0)
    prompts = workload.requests()
    assert len(prompts) == 12
    assert {len(p) for p in prompts} == {64 + QUESTION_TOKENS}
    assert all(TOKEN_IDS.start <= t < TOKEN_IDS.stop for p in prompts for t in p)
    docs = {tuple(p[:64]) for p in prompts}
    assert len(docs) == 4  # each document's questions share its 64 tokens
    assert len({d[:16] for d in docs}) == 4  # documents share no first page
    assert len({tuple(p) for p in prompts}) == 12  # each question is its own
    assert prompts == workload.requests()  # the same order every run
    other = Workload(docs=4, doc_tokens=64, questions=3, concurrency=2, seed=1).requests()
    assert other != prompts
