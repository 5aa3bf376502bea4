"""How long a worker is given to start answering: derived from the request, not one constant.

A worker that accepts a request and never answers used to hold it for the whole first-byte
timeout (600 s). The time given is now what a slow but working engine would need:

    floor + prompt_tokens × (1 + requests ahead) / min_prefill_rate
          (+ max_new_tokens / min_decode_rate for a non-streamed answer, which starts only
           after its last token; without max_new_tokens, up to the context: the cap)

at most the cap (``--first-byte-timeout``). "Requests ahead" are those already in flight on
the worker, which an engine may have to prefill first. The rates are floors: an engine slower
than ``--min-prefill-rate`` tokens/s of prefill (or ``--min-decode-rate`` tokens/s of
decoding) counts as stuck. For a stream the same time bounds its first body chunk, since
SGLang sends a stream's head before the first token; after that, ``--stream-idle-timeout``
bounds every gap.

Past the time a stream would have (`FirstByteBudget.alive_seconds`: floor and prefill), a
request without its answer's head waits on only while its worker shows it is alive, with
health checks on: a probe passed since (asked again every such period); a probe that failed
with none passed ends the wait there (`relay.liveness`; issue 57 item 8: a hung
worker held every non-streamed request without ``max_tokens`` for the cap, 600 s, until the
probes ejected it). A worker whose probes pass keeps such a request to the cap; when its
client leaves past that time and the worker answered nobody meanwhile, the worker is counted
a failure (`relay._stuck`), so outlier detection ejects an engine that answers nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpuserve_router.config import RouterConfig


@dataclass(frozen=True, slots=True)
class FirstByteBudget:
    floor_seconds: float
    cap_seconds: float
    prefill_tokens_per_second: float
    decode_tokens_per_second: float

    def alive_seconds(self, prompt_tokens: int, ahead: int) -> float:
        """Seconds after which only a worker that shows it is alive is waited for: what a
        stream of this prompt is given (its first token)."""
        return self.seconds(prompt_tokens, None, True, ahead)

    def seconds(
        self, prompt_tokens: int, max_new_tokens: int | None, stream: bool, ahead: int
    ) -> float:
        """Seconds a worker with ``ahead`` requests in flight is given for this request."""
        wait = self.floor_seconds + prompt_tokens * (1 + ahead) / self.prefill_tokens_per_second
        if not stream:
            if max_new_tokens is None:
                return self.cap_seconds
            wait += max_new_tokens / self.decode_tokens_per_second
        return wait if wait < self.cap_seconds else self.cap_seconds


def first_byte_budget(config: RouterConfig) -> FirstByteBudget:
    """The first-byte budget the router's settings give."""
    return FirstByteBudget(
        floor_seconds=config.first_byte_timeout_floor_seconds,
        cap_seconds=config.first_byte_timeout_seconds,
        prefill_tokens_per_second=config.min_prefill_tokens_per_second,
        decode_tokens_per_second=config.min_decode_tokens_per_second,
    )
