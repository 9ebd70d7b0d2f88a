"""A GPU vgpud does not share (one in MIG mode): in `vgpud_gpus_excluded` and the debug state's
`excluded_gpus`, never in the vGPU views (`vgpud_gpu_*`, the state's `gpus`)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.unit.observe.node import container_dir, make_node, prepared_node, write_limits
from tests.unit.observe.test_metrics import families, family, value
from vgpud import metrics_names as names
from vgpud.gpu import open_inventory
from vgpud.gpu.mock import shipped_profiles

MIG_GPUS = open_inventory("mock", profile=shipped_profiles()["a100-40gb-x2-mig"]).gpus()


async def test_a_mig_gpu_is_shown_excluded_and_not_as_a_vgpu_gpu(short_tmp: Path) -> None:
    node = make_node(short_tmp)
    node.gpus = MIG_GPUS
    node.rebuild()
    mig_gpu, plain = MIG_GPUS
    found = families(node)
    excluded = found[family(names.GPUS_EXCLUDED)]
    assert [(s.labels, s.value) for s in excluded] == [
        ({"index": "0", "uuid": mig_gpu.uuid, "reason": "mig"}, 1.0)
    ]
    info = found[family(names.GPU_INFO)]
    assert [s.labels["uuid"] for s in info] == [plain.uuid]
    assert value(info, names.GPU_INFO.name, index="1", uuid=plain.uuid, product=plain.product_name) == 1
    assert [s.labels["uuid"] for s in found[family(names.GPU_MEMORY_TOTAL)]] == [plain.uuid]

    state = json.loads(json.dumps(await node.state.snapshot()))
    assert [g["uuid"] for g in state["gpus"]] == [plain.uuid]
    (shown,) = state["excluded_gpus"]
    assert {k: v for k, v in shown.items() if k != "mig_devices"} == {
        "index": 0,
        "uuid": mig_gpu.uuid,
        "product": "NVIDIA A100-SXM4-40GB",
        "reason": "mig",
        "excluded": "in MIG mode (4 MIG devices): vgpud does not share MIG GPUs",
    }
    assert [(m["uuid"], m["profile"], m["gpu_instance_id"]) for m in shown["mig_devices"]] == [
        (m.uuid, m.profile, m.gpu_instance_id) for m in mig_gpu.mig_devices
    ]


async def test_a_container_file_naming_a_mig_gpu_is_not_counted(short_tmp: Path) -> None:
    """A container's vgpu.config that names the MIG GPU (a claim prepared before it went into MIG
    mode) adds to no vGPU view: there is none for that GPU."""
    node = await prepared_node(short_tmp, lazy=True)
    node.gpus = MIG_GPUS
    node.rebuild()
    mig_gpu, plain = MIG_GPUS
    write_limits(await container_dir(node, "main"), mig_gpu.index, mig_gpu.uuid, 1 << 30, 50)
    await node.usage.read()
    state = json.loads(json.dumps(await node.state.snapshot()))
    assert [(g["uuid"], g["vgpus"]) for g in state["gpus"]] == [(plain.uuid, [])]
    assert [g["uuid"] for g in state["excluded_gpus"]] == [mig_gpu.uuid]
    allocated = families(node)[family(names.GPU_MEMORY_ALLOCATED)]
    assert [(s.labels["uuid"], s.value) for s in allocated] == [(plain.uuid, 0.0)]
