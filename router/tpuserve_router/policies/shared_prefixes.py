"""New conversations spread by load, not pinned by a shared prefix one engine happens to hold.

A prompt that starts with a prefix many conversations share (a system prompt) is a prefix hit
on the engine holding it, and the affinity rule sends it there however busy that engine is
until the fleet's loads are far apart (sglang-router's imbalance test: 64 requests). So an
engine that restarts, or joins, gets no new conversation while every shared prefix is held
elsewhere: issue 68 measured a restarted engine taking 0 of the ~5,400 requests that
followed. Hot shared prefixes should replicate instead, as the `cost` policy's bounded-load
rule makes them do; but a conversation's own history must keep its engine (moving it costs
its whole prefill again, and the routing consistency of its turns).

What tells them apart is where the match ends. A conversation's next turn matches up to the
end of its previous turn, and what follows there (the new question) is new: the next block is
not one seen after that point before. A new conversation matches up to the end of the shared
prefix, where many conversations branched: its next block differs from the one seen there
last time. `SharedPrefixes` keeps, for the last block of each recent hit, the block that
followed it (at most `MAX_ENDS`, 8,192, the oldest dropped first); a hit whose match ends at
a block seen followed by another one is a shared prefix, and such a hit is held to the bound
of consistent hashing with bounded loads (`prefix_routing.bounded`, ``shared_load_factor``,
1.25 by default, `cost`'s factor): when its holder would carry more than that times the
fleet's mean load, it goes to the worker within the bound holding the longest prefix of the
prompt, the least loaded among those (a miss there when none holds any). Follow-up turns, and
every prompt while loads are within the bound, route as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from tpuserve_router.policies.prefix_routing import bounded

MAX_ENDS: Final = 1 << 13
"""The most match ends remembered (about 150 bytes each: some 1.2 MiB at most). A shared
prefix's end is remembered anew by every conversation that branches there, so a small bound
keeps the busy ones; each conversation's own ends come and go (at 20 requests a second the
bound holds about the last 7 minutes of them)."""


class SharedPrefixes:
    def __init__(self, load_factor: float, max_ends: int = MAX_ENDS) -> None:
        self.load_factor = load_factor
        self.max_ends = max_ends
        self._next: dict[int, int] = {}  # a hit's last block key -> the key that followed it
        self.spread = 0  # hits sent away from a shared prefix's busy holder

    def __len__(self) -> int:
        return len(self._next)

    def is_shared(self, end: int, following: int) -> bool:
        """Whether a match ending at block ``end``, followed in this prompt by ``following``,
        ends where prompts branch (the block seen after ``end`` before was another)."""
        seen = self._next
        before = seen.get(end)
        if before == following:
            return False
        if before is None:
            if len(seen) >= self.max_ends:
                del seen[next(iter(seen))]
        else:
            del seen[end]  # the newest: kept longest
        seen[end] = following
        return before is not None

    def move(self, depths: Sequence[int], loads: Sequence[int], chosen: int) -> int:
        """``chosen``, or, when it is over the load bound, the worker within it holding the
        most of the prompt, the least loaded among those."""
        within = bounded(loads, self.load_factor)
        if within[chosen]:
            return chosen
        best = -1
        for i, ok in enumerate(within):
            if ok and (
                best < 0
                or depths[i] > depths[best]
                or (depths[i] == depths[best] and loads[i] < loads[best])
            ):
                best = i
        if best < 0:
            return chosen
        self.spread += 1
        return best
