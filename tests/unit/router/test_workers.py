"""Workers: URLs, health ejection and re-admission, outlier ejection, the registry."""

from __future__ import annotations

import pytest

from tpuserve_router.engines.workers import (
    InvalidWorkerURL,
    Worker,
    WorkerRegistry,
    WorkerSpec,
    normalize_worker_url,
    parse_worker_flag,
)

pytestmark = pytest.mark.unit


def test_urls_normalize_to_http_host_port() -> None:
    assert normalize_worker_url("http://127.0.0.1:30000/") == (
        "http://127.0.0.1:30000",
        "127.0.0.1",
        30000,
    )
    assert normalize_worker_url("10.0.0.2:8000")[0] == "http://10.0.0.2:8000"
    assert normalize_worker_url("http://[::1]:5")[0] == "http://[::1]:5"
    assert normalize_worker_url("http://host")[0] == "http://host:80"


@pytest.mark.parametrize(
    "url",
    [
        "https://h:1", "http://:1", "http://h:1/v1", "http://h:x", "http://[::1", "http://[zz]:1",
        "http://h:99999", "http://h:0", "http://user:pw@h:1", "http://a b:1", "http://%41:1",
        "http://\u00e9xample:1", "http://999.1.1.1:1", "http://" + "a" * 64 + ".example:1",
        "http://h:1" + "/" * 3000,
    ],
)  # fmt: skip
def test_bad_urls_say_what_is_expected(url: str) -> None:
    with pytest.raises(InvalidWorkerURL, match=r"expected http://HOST:PORT|host name"):
        normalize_worker_url(url)


@pytest.mark.parametrize(
    "alias",
    ["http://localhost:8000", "http://LOCALHOST.:8000", "http://127.0.0.1.:8000",
     "http://0x7f000001:8000", "http://127.1:8000", "http://2130706433:8000",
     "http://[::ffff:127.0.0.1]:8000", "127.0.0.1:8000"],
)  # fmt: skip
def test_aliases_of_one_address_name_one_worker(alias: str) -> None:
    assert normalize_worker_url(alias)[0] == "http://127.0.0.1:8000"


def test_registry_keeps_one_worker_for_all_its_aliases() -> None:
    registry = WorkerRegistry()
    first = registry.add(WorkerSpec("http://localhost:8000"))
    assert registry.add(WorkerSpec("http://0x7f000001:8000")) is first
    assert registry.add(WorkerSpec("http://127.0.0.1.:8000")) is first
    assert registry.names() == ["http://127.0.0.1:8000"]
    assert normalize_worker_url("http://Engine-0.Serving.svc:30000")[0] == (
        "http://engine-0.serving.svc:30000"
    )


def test_health_checks_eject_after_failures_and_readmit_after_success() -> None:
    worker = Worker(WorkerSpec("http://h:1"))
    assert not worker.healthy  # until the first check passes
    assert (worker.health_check_passed(1), worker.healthy) == (True, True)
    assert not worker.health_check_failed(3)
    assert (worker.health_check_failed(3), worker.healthy) == (False, True)
    assert (worker.health_check_failed(3), worker.healthy) == (True, False)  # the third ejects
    assert (worker.health_check_passed(2), worker.healthy) == (False, False)
    assert (worker.health_check_passed(2), worker.healthy) == (True, True)


def test_an_ejected_worker_is_not_routable_whatever_its_health_checks_say() -> None:
    worker = Worker(WorkerSpec("http://h:1"))
    worker.health_check_passed(1)
    worker.set_ejected(True)
    assert (worker.healthy, worker.health_check_passed(1)) == (False, False)
    assert not worker.healthy  # a passing probe does not end an ejection
    worker.set_ejected(False)
    assert worker.describe()["healthy"] is True


def test_a_worker_that_went_down_while_ejected_returns_when_its_checks_pass_again() -> None:
    worker = Worker(WorkerSpec("http://h:1"))
    worker.health_check_passed(1)
    worker.set_ejected(True)
    worker.health_check_failed(3)  # down (killed), then restarted
    assert worker.health_check_passed(1)
    assert (worker.ejected, worker.healthy) == (False, True)
    assert worker.describe()["ejected"] is False


def test_registry_sync_adds_removes_and_keeps_admin_workers() -> None:
    registry = WorkerRegistry()
    added: list[str] = []
    removed: list[str] = []
    registry.on_added.append(lambda w: added.append(w.name))
    registry.on_removed.append(lambda w: removed.append(w.name))
    registry.add(WorkerSpec("http://admin:1"), manual=True)
    assert registry.sync([WorkerSpec("http://a:1"), WorkerSpec("http://b:1")]) == (
        ["http://a:1", "http://b:1"], [])  # fmt: skip
    assert registry.sync([WorkerSpec("http://b:1")]) == ([], ["http://a:1"])
    assert registry.names() == ["http://admin:1", "http://b:1"]
    assert removed == ["http://a:1"]


def test_changed_kv_endpoints_replace_the_worker() -> None:
    registry = WorkerRegistry()
    first = registry.add(WorkerSpec("http://a:1", "tcp://a:5557"))
    assert registry.add(WorkerSpec("http://a:1", "tcp://a:5557")) is first
    assert registry.add(WorkerSpec("http://a:1", "tcp://a:6000")) is not first
    assert len(registry.workers) == 1


def routed(
    registry: WorkerRegistry, model: str, lora_path: str | None = None
) -> tuple[str, str | None, list[Worker]] | None:
    """`WorkerRegistry.route` as a tuple: (model label, adapter, workers), or None."""
    found = registry.route(model, lora_path)
    return None if found is None else (found.model, found.adapter, found.workers)


def test_routes_by_model_include_workers_not_yet_described() -> None:
    registry = WorkerRegistry()
    a = registry.add(WorkerSpec("http://a:1"))
    b = registry.add(WorkerSpec("http://b:1"))
    c = registry.add(WorkerSpec("http://c:1"))
    registry.set_models(a, ["llama"])
    registry.set_models(b, ["qwen"])
    assert routed(registry, "llama") == ("llama", None, [a, c])
    # c may serve anything until it says; a name no worker reported is no label value
    assert routed(registry, "mistral") == ("", None, [c])
    assert routed(registry, "") == ("", None, [a, b, c])
    registry.set_models(c, ["qwen"])
    assert routed(registry, "mistral") is None
    assert registry.known_models() == ["llama", "qwen"]


def test_a_worker_flag_may_name_its_model() -> None:
    assert parse_worker_flag("http://a:1") == WorkerSpec("http://a:1")
    assert parse_worker_flag("org/llama-3:8b=http://a:1") == WorkerSpec(
        "http://a:1", model="org/llama-3:8b"
    )
    with pytest.raises(InvalidWorkerURL, match="MODEL=URL"):
        parse_worker_flag("=http://a:1")
    with pytest.raises(InvalidWorkerURL, match="expected http://HOST:PORT"):
        parse_worker_flag("llama=ftp://a:1")


def test_a_registered_model_wins_over_what_the_worker_reports() -> None:
    registry = WorkerRegistry()
    a = registry.add(WorkerSpec("http://a:1", model="llama"))
    assert registry.known_models() == ["llama"]  # before its first /v1/models
    registry.set_models(a, ["something-else"], ["sql"])
    assert (a.models, a.adapters) == (("llama",), ("sql",))
    assert registry.add(WorkerSpec("http://a:1", model="qwen")) is not a  # moved: replaced
    assert registry.known_models() == ["qwen"]


def test_an_adapter_routes_to_the_workers_of_its_model_that_have_it_loaded() -> None:
    registry = WorkerRegistry()
    a = registry.add(WorkerSpec("http://a:1", model="llama"))
    b = registry.add(WorkerSpec("http://b:1", model="llama"))
    c = registry.add(WorkerSpec("http://c:1", model="qwen"))
    registry.set_models(a, [], ["sql"])
    registry.set_models(c, [], ["sql"])
    assert routed(registry, "llama:sql") == ("llama", "sql", [a])
    assert routed(registry, "llama", lora_path="sql") == ("llama", "sql", [a])
    # as SGLang: the adapter in the model name wins over lora_path
    assert routed(registry, "llama:sql", lora_path="other") == ("llama", "sql", [a])
    assert routed(registry, "llama:chat") is None
    assert routed(registry, "mistral:sql") is None
    assert routed(registry, "llama") == ("llama", None, [a, b])
    assert registry.served() == [
        ("llama", "llama"), ("llama:sql", "llama"), ("qwen", "qwen"), ("qwen:sql", "qwen")
    ]  # fmt: skip


def test_a_served_name_with_a_colon_splits_as_sglang_splits_it() -> None:
    registry = WorkerRegistry()
    registry.add(WorkerSpec("http://a:1", model="s3://bucket/llama"))
    assert registry.split_model("s3://bucket/llama") == ("s3://bucket/llama", None)
    assert registry.split_model("s3://bucket/llama:sql") == ("s3://bucket/llama", "sql")
    assert registry.split_model("other:sql ") == ("other", "sql")
    assert registry.split_model("other") == ("other", None)
