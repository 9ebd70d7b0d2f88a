"""CreateContainer through upb: the same bytes and the same strictness as betterproto2 + vgpud.wire."""

from __future__ import annotations

from pathlib import Path

import pytest

from vgpud._pb.nri.pkg.api.v1alpha1 import (
    Container,
    ContainerAdjustment,
    ContainerEviction,
    CreateContainerRequest,
    CreateContainerResponse,
    KeyValue,
    LinuxContainerAdjustment,
    PodSandbox,
)
from vgpud.nri.adjust import adjustment
from vgpud.nri.fastcodec import decode_create_container, encode_create_container
from vgpud.partition.assigner import ContainerContext
from vgpud.partition.layout import Layout
from vgpud.partition.lazy import LazyAssigner
from vgpud.wire import MalformedMessage

REQUEST = CreateContainerRequest(
    pod=PodSandbox(id="sandbox", name="train", namespace="ml", uid="pod-uid", labels={"app": "x"}),
    container=Container(
        id="ctr", pod_sandbox_id="sandbox", name="main", env=["PATH=/bin", "MANAGER_VGPU_CLAIM_UID=c"]
    ),
)


def test_decode_gives_the_fields_betterproto2_gives() -> None:
    decoded = decode_create_container(bytes(REQUEST))
    assert (decoded.pod.uid, decoded.pod.name, decoded.pod.namespace) == ("pod-uid", "train", "ml")
    assert (decoded.container.id, decoded.container.name) == ("ctr", "main")
    assert list(decoded.container.env) == ["PATH=/bin", "MANAGER_VGPU_CLAIM_UID=c"]


@pytest.mark.parametrize(
    "data",
    [
        bytes(REQUEST)[:-3],  # truncated
        b"\x0a\x02\xc3\x28" + b"",  # pod: a nested message that is not one
        b"\x12\x04\x2a\x02\xc3\x28",  # container.name (5) with invalid UTF-8
        b"\x12\x02\x28\x01",  # container.name sent as a varint: a wire type upb would file away
    ],
)
def test_decode_refuses_what_the_strict_check_refuses(data: bytes) -> None:
    with pytest.raises(MalformedMessage):
        decode_create_container(data)


def test_an_injection_reply_has_betterproto2s_bytes(tmp_path: Path) -> None:
    assigner = LazyAssigner(Layout(tmp_path), driver="manager.nvidia.com")
    plan = assigner.inject(ContainerContext("claim", "pod-uid", "train", "ml", "main"))
    reply = CreateContainerResponse(adjust=adjustment(plan))
    assert encode_create_container(reply) == bytes(reply)
    assert len(bytes(reply)) > 500


@pytest.mark.parametrize(
    "reply",
    [
        CreateContainerResponse(),
        CreateContainerResponse(adjust=ContainerAdjustment(env=[KeyValue(key="A", value="b")])),
        CreateContainerResponse(
            adjust=ContainerAdjustment(
                env=[KeyValue(key="A", value="b")], linux=LinuxContainerAdjustment(cgroups_path="/x")
            )
        ),
        CreateContainerResponse(adjust=ContainerAdjustment(), evict=[ContainerEviction(container_id="x")]),
    ],
)
def test_any_other_reply_is_encoded_in_full(reply: CreateContainerResponse) -> None:
    assert encode_create_container(reply) == bytes(reply)
