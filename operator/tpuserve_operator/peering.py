"""kopf peering for high availability: the peering CRDs and the peering objects.

kopf pauses an operator while a live peer with a higher priority exists, and pauses *all*
peers that share the same priority. So HA runs every replica with its own random priority:
the highest serves, the others wait, and when it dies (its keep-alive lapses after
`--peering-lifetime` seconds) the next highest resumes. The peering object must exist
before kopf can use it; the operator creates it at startup (`peering_object`).
"""

from __future__ import annotations

import random
from typing import Any

GROUP = "kopf.dev"
VERSION = "v1"
CLUSTER_PLURAL = "clusterkopfpeerings"
NAMESPACED_PLURAL = "kopfpeerings"
PRIORITY_RANGE = (1, 1_000_000)


def random_priority() -> int:
    """A priority unlikely to equal a peer's (equal priorities pause everyone)."""
    return random.randint(*PRIORITY_RANGE)


def _crd(kind: str, plural: str, scope: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": scope,
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "description": (
                                f"{kind}: keep-alives of kopf operators sharing this peering "
                                "(status maps each operator's identity to its priority and "
                                "lifetime)."
                            ),
                            "type": "object",
                            "properties": {
                                "status": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                }
                            },
                        }
                    },
                }
            ],
        },
    }


def custom_resource_definitions() -> list[dict[str, Any]]:
    return [
        _crd("ClusterKopfPeering", CLUSTER_PLURAL, "Cluster"),
        _crd("KopfPeering", NAMESPACED_PLURAL, "Namespaced"),
    ]


def peering_object(name: str, namespace: str | None) -> dict[str, Any]:
    """A ClusterKopfPeering (cluster-wide operator) or a KopfPeering in `namespace`."""
    if namespace is None:
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ClusterKopfPeering",
            "metadata": {"name": name},
        }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "KopfPeering",
        "metadata": {"name": name, "namespace": namespace},
    }
