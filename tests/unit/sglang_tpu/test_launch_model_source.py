"""Model sources parse strictly, land in the weights cache, and never leak the HF token."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_tpu import launch
from sglang_tpu.model_source import (
    FETCHED_MARKER,
    FetchError,
    ModelSourceError,
    fetch,
    parse_model_source,
)
from tests.contract_env import contract_env
from tests.fakes import FakeTPUProbe

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "scheme", "location", "path", "revision", "served"),
    [
        (
            "hf://meta-llama/Llama-3.1-8B",
            "hf",
            "meta-llama/Llama-3.1-8B",
            "",
            None,
            "meta-llama/Llama-3.1-8B",
        ),
        ("hf://Qwen/Qwen3-8B@v1.0", "hf", "Qwen/Qwen3-8B", "", "v1.0", "Qwen/Qwen3-8B"),
        (
            "gs://my-bucket/models/llama-70b/",
            "gs",
            "my-bucket",
            "models/llama-70b",
            None,
            "llama-70b",
        ),
        ("pvc://weights/llama", "pvc", "weights", "llama", None, "llama"),
        ("pvc://weights", "pvc", "weights", "", None, "weights"),
        ("/models//llama/", "local", "/models/llama", "", None, "llama"),
    ],
)
def test_allowed_forms(
    text: str, scheme: str, location: str, path: str, revision: str | None, served: str
) -> None:
    source = parse_model_source(text)
    assert (source.scheme, source.location, source.path, source.revision) == (
        scheme,
        location,
        path,
        revision,
    )
    assert source.default_served_name == served
    assert parse_model_source(str(source)) == source


@pytest.mark.parametrize(
    "text",
    [
        "meta-llama/Llama-3.1-8B",
        "hf://llama",
        "hf://a/b/c",
        "hf://a/b@",
        "gs://Bad_Bucket/x",
        "gs://bucket",
        "gs://bucket/../x",
        "pvc://Claim/x",
        "s3://bucket/x",
        "relative/path",
        "/models/../etc",
    ],
)
def test_other_forms_are_refused(text: str) -> None:
    with pytest.raises(ModelSourceError, match="'"):
        parse_model_source(text)


def test_local_paths() -> None:
    assert parse_model_source("hf://o/n@abc").local_path("/w", None) == "/w/hf/o/n/abc"
    assert parse_model_source("hf://o/n").local_path("/w", None) == "/w/hf/o/n/main"
    gs = parse_model_source("gs://bkt/m/x")
    assert gs.local_path("/w", None) == "/w/gcs/bkt/m/x"
    assert gs.local_path("/w", "/mnt/gcs") == "/mnt/gcs/bkt/m/x"
    assert parse_model_source("pvc://c/m").local_path(None, None) == "/mnt/tpuserve/pvc/c/m"
    with pytest.raises(ModelSourceError):
        parse_model_source("hf://o/n").local_path(None, None)


def test_hf_fetch_passes_the_token_and_redacts_it_from_errors(tmp_path: Path) -> None:
    calls: list[tuple[str, str | None, str, str | None]] = []

    def download(repo: str, revision: str | None, local_dir: str, token: str | None) -> None:
        calls.append((repo, revision, local_dir, token))

    source = parse_model_source("hf://org/model@rev")
    env = {"MY_TOKEN": "hf_s3cret"}
    path = fetch(source, str(tmp_path), None, env, "MY_TOKEN", hf_download=download)
    assert path == f"{tmp_path}/hf/org/model/rev"
    assert calls == [("org/model", "rev", path, "hf_s3cret")]

    def failing(repo: str, revision: str | None, local_dir: str, token: str | None) -> None:
        raise RuntimeError(f"401 for token {token}")

    with pytest.raises(FetchError) as err:
        fetch(source, str(tmp_path), None, env, "MY_TOKEN", hf_download=failing)
    assert "hf_s3cret" not in str(err.value)
    assert "<redacted>" in str(err.value)


def test_gcs_download_happens_once_per_cache_volume(tmp_path: Path) -> None:
    calls: list[tuple[str, str, str]] = []

    def download(bucket: str, prefix: str, local_dir: str) -> None:
        calls.append((bucket, prefix, local_dir))
        Path(local_dir).mkdir(parents=True)
        Path(local_dir, "config.json").write_text("{}")

    source = parse_model_source("gs://bucket/models/m")
    first = fetch(source, str(tmp_path), None, {}, "HF_TOKEN", gcs_download=download)
    again = fetch(source, str(tmp_path), None, {}, "HF_TOKEN", gcs_download=download)
    assert first == again == f"{tmp_path}/gcs/bucket/models/m"
    assert Path(first, FETCHED_MARKER).exists()
    assert calls == [("bucket", "models/m", first)]


def test_mounted_and_local_sources_must_exist(tmp_path: Path) -> None:
    (tmp_path / "bucket" / "m").mkdir(parents=True)
    mounted = parse_model_source("gs://bucket/m")
    assert fetch(mounted, None, str(tmp_path), {}, "HF_TOKEN") == f"{tmp_path}/bucket/m"
    with pytest.raises(FetchError, match="not a directory"):
        fetch(parse_model_source(f"{tmp_path}/missing"), None, None, {}, "HF_TOKEN")


def test_launch_exits_1_when_the_weights_are_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = contract_env(model=f"{tmp_path}/no-such-model")
    env["TPUSERVE_COMPILE_CACHE_DIR"] = f"{tmp_path}/compile"
    env["TPUSERVE_SGLANG_KV_WRITES"] = "eager"  # an image whose compiled step is right
    probe = FakeTPUProbe.matching("v6e", "2x4")  # the pre-flight passes
    assert launch.launch(env, dry_run=False, probe=probe) == launch.EXIT_FETCH_FAILED
    assert "no-such-model" in capsys.readouterr().err
    assert (tmp_path / "compile" / "v6e-2x4").is_dir()  # cache directories are created first
