"""Prefill/decode (PD) disaggregation: SGLang 0.5.23's contract, and the KV link it runs over.

The one place tpuserve spells SGLang's PD contract; the engine twin, the router and the
operator import it. Each fact was read in the pinned wheel (``sglang/srt/disaggregation/``,
``server_args.py``, ``environ.py``, ``managers/scheduler.py``):

- engine flags ``--disaggregation-mode`` (``null`` | ``prefill`` | ``decode``),
  ``--disaggregation-bootstrap-port`` (8998, the prefill's bootstrap server) and
  ``--disaggregation-transfer-backend`` (enum ``TransferBackend``: mooncake, mori, nixl,
  ascend, fake; default mooncake). None of them moves KV between TPUs: they are RDMA (GPU/NPU)
  backends, and ``fake`` moves nothing (for tests; the decode then runs on KV it never got);
- a request carries ``bootstrap_host``, ``bootstrap_port``, ``bootstrap_room``; a batched one
  lists them, and SGLang fills a scalar room as ``room + i`` (``io_struct``);
- a prefill- or decode-mode engine refuses a request without ``bootstrap_room`` (400,
  `NO_ROOM_MESSAGE`) unless its backend is ``fake``. **A decode engine cannot prefill a
  request itself**: "run it on the decode replica alone" is not possible with SGLang, so a
  router that skips the prefill leg needs colocated (``null``) engines to send it to;
- the prefill's DP rank is ``bootstrap_room % dp_size`` (``follow_bootstrap_room``);
- the bootstrap server (aiohttp inside the prefill engine) serves ``PUT``/``GET /route``,
  ``POST /register_dp_rank``, ``POST /query_dp_ranks`` and ``GET /health``;
- timeouts from the environment: ``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`` (300 s, the
  prefill waits this long for the decode) and ``SGLANG_DISAGGREGATION_WAITING_TIMEOUT``
  (300 s, the decode waits this long for the KV).

The KV link (`KV_LINKS`): prefill and decode are different slices, so their KV moves over
the data-centre network (DCN), never ICI, which joins chips inside one slice only (Cloud TPU
documents ICI per chip and DCN per host or per chip; figures and pages in `KvLink`).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from sglang_tpu.perf_model import StepTimer

SGLANG_VERSION: Final = "0.5.23"  # the release these facts were read in
MODES: Final = ("null", "prefill", "decode")
TRANSFER_BACKENDS: Final = ("mooncake", "mori", "nixl", "ascend", "fake")
DEFAULT_TRANSFER_BACKEND: Final = "mooncake"
DEFAULT_BOOTSTRAP_PORT: Final = 8998
BOOTSTRAP_PORT_ANNOTATION: Final = "sglang.ai/bootstrap-port"  # read by sglang-router's discovery
PD_ROLE_LABEL: Final = "serving.tpuserve.dev/pd-role"
"""The pod label the operator puts on a disaggregated server's engine pods (``prefill`` or
``decode``) and the router's discovery reads."""
PD_ROLES: Final = ("prefill", "decode")
PD_CONTRACT_LABEL: Final = "serving.tpuserve.dev/pd-contract"
"""The pod label naming what a prefill and a decode engine must share to pair (the operator
hashes the engine image, the model, the transfer backend, the page size and KV dtype into
it): the router pairs only engines whose labels are equal, so during a rollout that changes
any of them an old prefill never hands KV to a new decode."""
FAKE_BOOTSTRAP_HOST: Final = "2.2.2.2"  # SGLang's warmup sentinel: "no transfer"
BOOTSTRAP_FIELDS: Final = ("bootstrap_host", "bootstrap_port", "bootstrap_room")
MAX_ROOM: Final = 2**63 - 1
BOOTSTRAP_TIMEOUT_ENV: Final = "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"
WAITING_TIMEOUT_ENV: Final = "SGLANG_DISAGGREGATION_WAITING_TIMEOUT"
DEFAULT_BOOTSTRAP_TIMEOUT_SECONDS: Final = 300.0
DEFAULT_WAITING_TIMEOUT_SECONDS: Final = 300.0
RESERVED_DECODE_TOKENS: Final = 512
"""KV a decode engine keeps for each running request's next tokens when it preallocates a
transferred one (``--num-reserved-decode-tokens``, 512)."""
NO_ROOM_MESSAGE: Final = (
    "Invalid request: Disaggregated request received without bootstrap room id. req.rid={rid!r}"
)
ENGINE_TYPES: Final = MappingProxyType(
    {"null": "unified", "prefill": "prefill", "decode": "decode"}
)
"""The ``engine_type`` label of an engine's metrics by mode (``to_engine_type``)."""

# Transfer backends that can move KV between TPU slices with the pinned SGLang: none. `fake`
# runs (it moves nothing), so it is allowed for CPU tests and the simulated engine only.
TPU_TRANSFER_BACKENDS: Final = ()
SIMULATED_TRANSFER_BACKENDS: Final = ("fake", "mooncake")


def timeout_seconds(env: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """One of SGLang's PD timeouts as the engine reads it from its environment."""
    value = (os.environ if environ is None else environ).get(env)
    if value is None or value == "":
        return default
    try:
        seconds = float(int(value))  # SGLang's EnvInt
    except ValueError:
        raise ValueError(f"{env}: {value!r} is not allowed; allowed: whole seconds") from None
    if seconds <= 0:
        raise ValueError(f"{env}: {value!r} is not allowed; allowed: > 0")
    return seconds


def room_for_rank(rank: int, dp_size: int, random_bits: int | None = None) -> int:
    """A random 63-bit bootstrap room that SGLang sends to prefill DP rank ``rank``
    (``room % dp_size == rank``): the router picks the rank that holds a prompt's prefix."""
    if dp_size < 1 or not 0 <= rank < dp_size:
        raise ValueError(f"rank {rank} is not allowed; allowed: 0..{dp_size - 1}")
    bits = secrets.randbits(63) if random_bits is None else random_bits & MAX_ROOM
    room = bits - bits % dp_size + rank
    if room > MAX_ROOM:
        room -= dp_size
    return room


def dp_rank_of(room: int, dp_size: int) -> int:
    """The prefill DP rank SGLang serves ``room`` on."""
    return room % max(1, dp_size)


def bootstrap_fields(
    host: str, port: int | None, room: int, batch: int | None
) -> dict[str, object]:
    """The three fields a router adds to one request (``batch``: a batched ``/generate`` of
    that many prompts, whose fields are lists with rooms ``room + i``)."""
    if batch is None:
        return {"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room}
    return {
        "bootstrap_host": [host] * batch,
        "bootstrap_port": [port] * batch,
        "bootstrap_room": [min(MAX_ROOM, room + i) for i in range(batch)],
    }


@dataclass(frozen=True, slots=True)
class KvLink:
    """The network a KV transfer crosses: bandwidth per host (or per chip) and latency."""

    name: str
    bytes_per_second_per_host: float
    latency_seconds: float
    source: str

    def transfer_seconds(self, kv_bytes: float, hosts: int = 1) -> float:
        """Seconds to move ``kv_bytes`` when ``hosts`` hosts send in parallel."""
        return self.latency_seconds + kv_bytes / (self.bytes_per_second_per_host * max(1, hosts))


# Cloud TPU pages (docs.cloud.google.com/tpu/docs/<generation>), read 2026-12: v5e "Per-host
# NIC configuration 2 x 100 Gbps NIC", ICI "400 GBps" bidirectional per chip; v5p "DCN
# bandwidth per chip 50 Gbps" (4 chips a host: 200 Gbps), ICI 1200 GBps; v6e ICI 800 GBps, no
# DCN figure published: taken as v5e's 200 Gbps a host [not verified]. A transfer uses half
# the bidirectional ICI figure (one direction). Latency: one RPC round trip, assumed 1 ms (DCN)
# and 0.1 ms (ICI) [not verified].
DCN_BYTES_PER_SECOND_PER_HOST: Final = 200e9 / 8
KV_LINKS: Final[Mapping[str, KvLink]] = MappingProxyType(
    {
        "dcn": KvLink(
            "dcn", DCN_BYTES_PER_SECOND_PER_HOST, 1e-3,
            "Cloud TPU v5e: 2 x 100 Gbps NIC per host; v5p: 50 Gbps per chip x 4",
        ),
        "ici": KvLink(
            "ici", 4 * 400e9 / 2, 1e-4,
            "Cloud TPU v5e: 400 GBps bidirectional ICI per chip, 4 chips a host, one direction",
        ),
    }
)  # fmt: skip
DEFAULT_KV_LINK: Final = "dcn"


def kv_transfer_seconds(
    prompt_tokens: int, kv_bytes_per_token: float, link: str = DEFAULT_KV_LINK, hosts: int = 1
) -> float:
    """Seconds to move a prompt's KV from a prefill slice to a decode slice over ``link``."""
    return KV_LINKS[link].transfer_seconds(prompt_tokens * kv_bytes_per_token, hosts)


DEFAULT_ITL_BUDGET_SECONDS: Final = 0.05
MAX_THRESHOLD_TOKENS: Final = 1 << 20


def threshold_tokens(
    timer: StepTimer, itl_budget_seconds: float, limit: int = MAX_THRESHOLD_TOKENS
) -> int:
    """The shortest uncached prompt worth disaggregating: the fewest new tokens whose prefill
    step, by the performance model, takes ``itl_budget_seconds`` or more. On a colocated
    engine such a prefill stalls every running decode that long (one inter-token gap), which
    a prefill replica avoids at the cost of a KV transfer. ``limit`` when none does."""
    if timer.prefill_seconds(limit) < itl_budget_seconds:
        return limit
    low, high = 1, limit
    while low < high:
        middle = (low + high) // 2
        if timer.prefill_seconds(middle) >= itl_budget_seconds:
            high = middle
        else:
            low = middle + 1
    return low


def prefill_stalls(
    timer: StepTimer | None, uncached: int, cached: int, threshold: int,
    itl_budget_seconds: float,
) -> bool:  # fmt: skip
    """Whether a colocated engine's prefill of ``uncached`` new tokens after ``cached`` ones
    stalls its running decodes for ``itl_budget_seconds`` or longer: the ``threshold``
    (`threshold_tokens`) or more new tokens, or, by ``timer``'s performance model, fewer whose
    attention over a long cached prefix takes that long. Without a timer, the threshold."""
    if uncached >= threshold:
        return True
    if timer is None or uncached <= 0:
        return False
    return timer.prefill_seconds(uncached, cached) >= itl_budget_seconds


def timer_for(spec: str, field_path: str = "--pd-perf-model") -> StepTimer:
    """A step timer from ``GENERATION:TOPOLOGY:PROFILE`` (e.g. ``v6e:2x4:llama-3.1-8b``);
    ValueError naming ``field_path`` and the form."""
    from sglang_tpu.perf_model import StepTimer, get_profile
    from sglang_tpu.topology import CatalogError, lookup

    parts = spec.split(":")
    if len(parts) != 3:
        raise ValueError(
            f"{field_path}: {spec!r} is not allowed; allowed: GENERATION:TOPOLOGY:PROFILE, "
            "e.g. v6e:2x4:llama-3.1-8b"
        )
    try:
        return StepTimer(lookup(parts[0], parts[1], field_path=field_path), get_profile(parts[2]))
    except (CatalogError, ValueError) as err:
        raise ValueError(f"{field_path}: {err}") from None
