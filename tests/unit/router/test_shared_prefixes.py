"""A shared prefix's busy holder does not pin every new conversation; a conversation's own
history keeps its engine (`tpuserve_router.policies.shared_prefixes`)."""

from __future__ import annotations

import pytest

from tests.fakes import VirtualClock, fake_request, fake_worker
from tpuserve_router.policies import PolicyConfigError, make_policy
from tpuserve_router.policies.precise import PrecisePolicy
from tpuserve_router.policies.shared_prefixes import SharedPrefixes

pytestmark = pytest.mark.unit

PAGE = 4
SYSTEM = list(range(10 * PAGE))  # ten pages every conversation starts with


def store(policy: PrecisePolicy, worker: str, tokens: list[int]) -> None:
    parent = None
    for p in range(len(tokens) // PAGE):
        engine_hash = hash(("engine", worker, tuple(tokens[: (p + 1) * PAGE])))
        policy.block_index.store(
            worker, [engine_hash], parent, tokens[p * PAGE : (p + 1) * PAGE], PAGE
        )
        parent = engine_hash


def new_conversation(i: int) -> list[int]:
    return [*SYSTEM, *range(10_000 + 100 * i, 10_000 + 100 * i + 3 * PAGE)]


def policy_of(shared_load_factor: float = 1.25) -> PrecisePolicy:
    policy = make_policy(
        "precise", clock=VirtualClock(), page_size=PAGE, shared_load_factor=shared_load_factor
    )
    assert isinstance(policy, PrecisePolicy)
    return policy


def test_new_conversations_leave_a_busy_holder_of_their_shared_prefix() -> None:
    """The restarted engine ("b", idle, empty) against the holder of the system prompt ("a",
    six in flight): before, every new conversation was a prefix hit on "a"."""
    policy = policy_of()
    store(policy, "a", SYSTEM)
    workers = [fake_worker("a", 6), fake_worker("b", 0)]
    first = policy.choose(fake_request(token_ids=new_conversation(0)), workers)
    assert first.worker.name == "a"  # where prompts branch is not known yet
    second = policy.choose(fake_request(token_ids=new_conversation(1)), workers)
    assert second.worker.name == "b"
    assert second.outcome == "balanced_away"
    shared = policy.shared
    assert shared is not None
    assert shared.spread == 1


def test_a_conversations_next_turn_stays_on_its_busy_holder() -> None:
    """Each turn extends the last (its answer, then a new question), where no other prompt
    went on: not a shared prefix, however busy its holder."""
    policy = policy_of()
    prompt = new_conversation(0)
    workers = [fake_worker("a", 6), fake_worker("b", 0)]
    for turn in range(4):
        store(policy, "a", prompt)  # the engine reports what it prefilled
        prompt = prompt + list(range(60_000 + 100 * turn, 60_000 + 100 * turn + 3 * PAGE))
        decision = policy.choose(fake_request(token_ids=prompt), workers)
        assert decision.worker.name == "a"
        assert decision.outcome == "prefix_hit"
    shared = policy.shared
    assert shared is not None
    assert shared.spread == 0


def test_within_the_load_bound_the_holder_keeps_its_shared_prefix() -> None:
    policy = policy_of()
    store(policy, "a", SYSTEM)
    workers = [fake_worker("a", 2), fake_worker("b", 1)]  # cap ceil(1.25 * 4 / 2) = 3
    names = [policy.choose(fake_request(token_ids=new_conversation(i)), workers).worker.name
             for i in range(4)]  # fmt: skip
    assert names == ["a"] * 4


def test_the_bound_can_be_turned_off_and_is_validated() -> None:
    policy = policy_of(shared_load_factor=0)
    store(policy, "a", SYSTEM)
    workers = [fake_worker("a", 6), fake_worker("b", 0)]
    names = [policy.choose(fake_request(token_ids=new_conversation(i)), workers).worker.name
             for i in range(3)]  # fmt: skip
    assert names == ["a"] * 3
    with pytest.raises(
        PolicyConfigError, match=r"shared_load_factor=0.5 must be 0 \(off\) or >= 1"
    ):
        policy_of(shared_load_factor=0.5)


def test_match_ends_are_bounded() -> None:
    shared = SharedPrefixes(1.25, max_ends=3)
    for end in range(5):
        assert not shared.is_shared(end, 100)
    assert len(shared) == 3
    assert shared.is_shared(4, 101)  # seen followed by 100: a branch
    assert not shared.is_shared(0, 101)  # forgotten (the oldest went first)


def test_the_policy_holds_match_ends_to_shared_prefix_ends() -> None:
    """Every new conversation's hit on the system prompt, then each one's next turn, leaves a
    match end; the policy's bound (``shared_prefix_ends``) holds them, and their number is
    exported as an index size."""
    policy = make_policy("precise", clock=VirtualClock(), page_size=PAGE, shared_prefix_ends=4)
    assert isinstance(policy, PrecisePolicy)
    store(policy, "a", SYSTEM)
    workers = [fake_worker("a"), fake_worker("b")]
    for i in range(12):
        tokens = new_conversation(i)
        store(policy, "a", tokens)
        policy.choose(fake_request(token_ids=[*tokens, *range(50_000 + 100 * i, 50_010 + 100 * i)]),
                      workers)  # fmt: skip
    assert policy.index_sizes()["shared_prefix_ends"] == 4
    with pytest.raises(PolicyConfigError, match="shared_prefix_ends=0 must be >= 1"):
        make_policy("precise", shared_prefix_ends=0)
