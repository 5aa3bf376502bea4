"""`kubectl apply` refuses a bad TPUModelServer on a real kube-apiserver, naming the field, with
the operator's own message: the chart's ValidatingAdmissionPolicy, installed by `helm install`.

One flow: a TPUModelServer that is invalid but created before the chart stays manageable
(metadata-only updates pass, spec changes are checked); every `# refused:` example in the docs
is refused (docs/pd.md has one per rule of a disaggregated server); a sample over the catalog
gets the operator's verdict from the apiserver; the chart's examples and the TPUModelServers
`tpuserve plan --emit` wrote for docs/capacity-planning.md are admitted; `helm uninstall`
removes the policy.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

import pytest
import yaml

from sglang_tpu.topology import SLICE_SHAPES
from tests.e2e.tms_harness import CRDS, NOT_YET, POLL_SECONDS, REPO, TIMEOUT_SECONDS
from tests.fake_kube import operator_verdict, tms_object
from tests.waiting import eventually
from tpuserve.cluster import Cluster, kube
from tpuserve.cluster.tools import CommandError
from tpuserve_operator import labels

pytestmark = pytest.mark.e2e

CHART = REPO / "charts" / "tpuserve"
RELEASE = "tpuserve"
DOCS = [
    REPO / "README.md",
    REPO / "charts/tpuserve/README.md",
    *sorted((REPO / "docs").glob("*.md")),
]
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
PLANNED = sorted(REPO.glob("bench/fleet_results/*/plan-*.yaml"))
# One refused example per rule of a disaggregated server (docs/pd.md), by the field it names.
PD_RULE_FIELDS = frozenset(
    {
        "spec.disaggregation.transferBackend",  # engine.type sglang: no TPU transfer backend
        "spec.disaggregation.decode.image",  # roles of different images
        "spec.disaggregation.decode.args.page-size",  # page sizes differ
        "spec.disaggregation.decode.args.kv-cache-dtype",  # KV dtypes differ
        "spec.engine.args.disaggregation-mode",  # a disaggregation flag in engine.args
        "spec.disaggregation.prefill.args.disaggregation-bootstrap-port",  # ... in a role's args
        "spec.disaggregation.decode.args.tp-size",  # a flag the operator owns in a role's args
        "spec.autoscaling",  # autoscaling with roles
        "spec.disaggregation.prefill.autoscaling.metric",  # a metric of the other role's load
        "spec.disaggregation.decode.autoscaling.minReplicas",  # a role scaled to zero
        "spec.disaggregation.decode.tpu.topology",  # a role's slice not in the catalog
    }
)
REFUSED = re.compile(r"```yaml\n(# refused: (\S+).*?\n.*?)```", re.DOTALL)


def refused_examples() -> list[tuple[str, str, dict[str, Any]]]:
    """(where, field, manifest) of every yaml block in the docs that opens `# refused: FIELD`."""
    found = []
    for path in DOCS:
        for match in REFUSED.finditer(path.read_text()):
            manifest = yaml.safe_load(match.group(1))
            found.append(
                (
                    f"{path.relative_to(REPO)}: {manifest['metadata']['name']}",
                    match.group(2),
                    manifest,
                )
            )
    return found


def apply(cluster: Cluster, manifest: dict[str, Any], namespace: str, *extra: str) -> str:
    """`kubectl apply` the manifest; its stderr when refused, "" when applied."""
    try:
        cluster.kubectl("apply", "-n", namespace, *extra, "-f", "-", input=yaml.safe_dump(manifest))
    except CommandError as err:
        return str(err.stderr)
    return ""


def test_kubectl_apply_refuses_what_the_operator_would_refuse(
    cluster: Cluster, namespace: str
) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRDS))
    legacy = tms_object(generation="v6e", topology="3x3", name="legacy")
    assert apply(cluster, legacy, namespace) == ""  # no policy yet: accepted, as before
    try:
        cluster.helm("install", RELEASE, str(CHART), "--namespace", namespace)
        bad = tms_object(generation="v6e", topology="3x3", name="probe")
        eventually(
            lambda: (
                "ValidatingAdmissionPolicy" in apply(cluster, bad, namespace, "--dry-run=server")
            ),
            what="the admission policy to refuse a 3x3 v6e slice",
            timeout_seconds=TIMEOUT_SECONDS,
            interval_seconds=POLL_SECONDS,
            ignore=NOT_YET,
        )

        # An object created before the policy: metadata-only updates pass, spec changes are checked.
        cluster.kubectl(
            "annotate", "-n", namespace, f"{labels.PLURAL}/legacy", f"{labels.RESTARTED_AT}=now"
        )
        refused = apply(cluster, {**legacy, "spec": {**legacy["spec"], "replicas": 2}}, namespace)
        assert "spec.tpu.topology: '3x3' is not allowed" in refused

        examples = refused_examples()
        assert len(examples) >= 5
        missing = PD_RULE_FIELDS - {field for _, field, _ in examples}
        assert not missing, f"no `# refused:` example in docs/pd.md for {sorted(missing)}"
        for where, field, manifest in examples:
            refused = apply(cluster, manifest, namespace)
            assert field in refused, (
                f"{where}: applied, or refused without naming {field}: {refused}"
            )
            verdict = operator_verdict(manifest | {"spec": _defaulted(manifest["spec"])})
            if verdict is not None and "ValidatingAdmissionPolicy" in refused:
                assert verdict in refused, where

        _apiserver_agrees_with_the_operator(cluster, namespace)
        _a_model_outside_the_profiles_is_admitted_by_its_architecture(cluster, namespace)

        assert len(PLANNED) >= 3, PLANNED
        for path in (*EXAMPLES, *PLANNED):
            manifest = yaml.safe_load(path.read_text())
            assert apply(cluster, manifest, namespace, "--dry-run=server") == "", path
    finally:
        cluster.helm("uninstall", RELEASE, "--namespace", namespace, check=False)
        with contextlib.suppress(CommandError):
            cluster.kubectl("delete", labels.PLURAL, "--all", "-n", namespace, "--wait=false")
    # Gone with the release (other tests in the session create invalid servers on purpose).
    after = tms_object(topology="3x3", name="after")
    eventually(
        lambda: apply(cluster, after, namespace, "--dry-run=server") == "",
        what="the admission policy to be gone after helm uninstall",
        timeout_seconds=TIMEOUT_SECONDS,
        interval_seconds=POLL_SECONDS,
        ignore=NOT_YET,
    )


def _defaulted(spec: dict[str, Any]) -> dict[str, Any]:
    """The CRD's defaults the apiserver fills in before admission, for the operator's check."""
    from tpuserve_operator.api import TPUModelServerSpec

    dumped: dict[str, Any] = TPUModelServerSpec.model_validate(spec).model_dump(
        by_alias=True, exclude_none=True
    )
    return dumped


MISTRAL_SOURCE = "hf://mistralai/Mistral-7B-Instruct-v0.3"
MISTRAL_ARCHITECTURE = {
    "numHiddenLayers": 32, "hiddenSize": 4096, "numAttentionHeads": 32, "numKeyValueHeads": 8,
    "headDim": 128, "intermediateSize": 14336, "vocabSize": 32768,
    "maxPositionEmbeddings": 32768,
}  # fmt: skip


def _a_model_outside_the_profiles_is_admitted_by_its_architecture(
    cluster: Cluster, namespace: str
) -> None:
    """Issue 58: a model none of the built-in profiles knows, given by spec.model.architecture,
    passes the CRD's schema, its CEL rules and the policy for both engines; without it the
    simulated engine is refused naming the field to add; an architecture with more KV heads
    than heads is refused by the CRD's rule."""
    for engine_type in ("sglang", "simulated"):
        server = tms_object(MISTRAL_SOURCE, "v6e", "1x1", engine_type=engine_type, name="mistral")
        assert operator_verdict(server) is not None or engine_type == "sglang"
        refused = apply(cluster, server, namespace, "--dry-run=server")
        assert ("spec.model.architecture" in refused) is (engine_type == "simulated"), refused
        server["spec"]["model"]["architecture"] = dict(MISTRAL_ARCHITECTURE)
        assert apply(cluster, server, namespace, "--dry-run=server") == ""
        server["spec"]["model"]["architecture"]["numKeyValueHeads"] = 64
        refused = apply(cluster, server, namespace, "--dry-run=server")
        assert "model.architecture.numKeyValueHeads must be at most numAttentionHeads" in refused


def _apiserver_agrees_with_the_operator(cluster: Cluster, namespace: str) -> None:
    """Every catalog slice with a small and a large model, and a context too long for any
    slice (KV beyond 1000 GiB: formatted without a thousands separator), by server dry run."""
    cases = [
        tms_object(f"hf://{model}", shape.generation.name, shape.topology, name="sample")
        for shape in SLICE_SHAPES
        for model in ("Qwen/Qwen3-8B", "meta-llama/Llama-3.3-70B-Instruct")
    ]
    cases.append(
        tms_object("hf://meta-llama/Llama-3.1-8B", "v6e", "2x4", context_length=10_485_760)
    )
    with contextlib.closing(cluster.api_client()) as api:
        custom = kube.client().CustomObjectsApi(api)
        for case in cases:
            expected = operator_verdict(case)
            try:
                custom.create_namespaced_custom_object(
                    labels.GROUP, labels.VERSION, namespace, labels.PLURAL, case, dry_run="All"
                )
                refused = ""
            except kube.api_exception() as err:
                refused = json.loads(getattr(err, "body", "{}") or "{}").get("message", str(err))
            if expected is None:
                assert refused == "", case["spec"]
            else:
                assert expected in refused, (expected, refused)
