"""The fake NVML's health: XID events and lost GPUs, set through the state file by tests/fakegpu_state.

Each scenario's NVML side runs in a child process through nvidia-ml-py (pynvml's own ctypes structs
and calls, so the ABI is the one vgpud uses); the test raises XIDs and drops GPUs from this process,
through the state file, as the e2e does while vgpud runs.
"""

from __future__ import annotations

import pytest

from tests.fakegpu_state import FakeGpuStateError, raise_xid, set_lost
from tests.unit.fakes.conftest import Env
from tests.unit.fakes.gpu import Child, start

# The child's NVML session, and `step()`: wait for the test's next line on stdin.
NVML = """
import pynvml
from vgpud.compat import pynvml as compat
compat.bind(ctypes.CDLL(os.environ["FAKE_NVML_LIB"]))
pynvml.nvmlInit()
handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1)]
def step():
    sys.stdin.readline()
def wait(ms):
    try:
        data = pynvml.nvmlEventSetWait_v2(events, ms)
    except pynvml.NVMLError as err:
        return dict(error=err.value)
    return dict(index=pynvml.nvmlDeviceGetIndex(data.device), type=data.eventType, xid=data.eventData,
                gi=data.gpuInstanceId, ci=data.computeInstanceId)
def code(fn, *args):
    try:
        fn(*args)
    except pynvml.NVMLError as err:
        return err.value
    return 0
events = pynvml.nvmlEventSetCreate()
"""
XID_EVENT = 0x8
TIMEOUT, GPU_IS_LOST, NOT_SUPPORTED = 10, 15, 3
NONE = 0xFFFFFFFF


def go(child: Child) -> dict:
    """Let the child take its next step; its report."""
    assert child.proc.stdin is not None
    child.proc.stdin.write("\n")
    child.proc.stdin.flush()
    return child.read()


def test_an_xid_raised_through_the_state_file_is_delivered_once_in_order(gpu_env: Env) -> None:
    env = gpu_env()
    child = start(
        NVML
        + """
emit(types=[pynvml.nvmlDeviceGetSupportedEventTypes(h) for h in handles])
for h in handles:
    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, events)
emit(idle=wait(20))
step()
emit(first=wait(5000), second=wait(5000), third=wait(5000), after=wait(20))
pynvml.nvmlEventSetFree(events)
pynvml.nvmlShutdown()
""",
        env,
    )
    assert child.read() == {"types": [XID_EVENT, XID_EVENT]}
    assert child.read() == {"idle": {"error": TIMEOUT}}
    state = env["FAKE_GPU_STATE"]
    raise_xid(state, 1, 79)
    raise_xid(state, 0, 13)
    raise_xid(state, 1, 48)
    got = go(child)
    child.finish()
    # device order first (index 0's XID comes before index 1's queued ones), then each device's order
    assert got["first"] == {"index": 0, "type": XID_EVENT, "xid": 13, "gi": NONE, "ci": NONE}
    assert got["second"] == {"index": 1, "type": XID_EVENT, "xid": 79, "gi": NONE, "ci": NONE}
    assert got["third"] == {"index": 1, "type": XID_EVENT, "xid": 48, "gi": NONE, "ci": NONE}
    assert got["after"] == {"error": TIMEOUT}


def test_only_xids_after_registration_and_only_of_registered_gpus_are_delivered(gpu_env: Env) -> None:
    env = gpu_env()
    child = start(
        NVML
        + """
emit(ready=True)
step()
pynvml.nvmlDeviceRegisterEvents(handles[0], pynvml.nvmlEventTypeXidCriticalError, events)
emit(registered=True)
step()
emit(event=wait(5000), after=wait(20))
""",
        env,
    )
    child.read()
    raise_xid(env["FAKE_GPU_STATE"], 0, 31)  # before the registration: not delivered
    go(child)
    raise_xid(env["FAKE_GPU_STATE"], 1, 79)  # GPU 1 is not registered
    raise_xid(env["FAKE_GPU_STATE"], 0, 94)
    got = go(child)
    child.finish()
    assert got["event"]["index"] == 0 and got["event"]["xid"] == 94
    assert got["after"] == {"error": TIMEOUT}


def test_a_reader_far_behind_gets_the_newest_ring_of_xids(gpu_env: Env) -> None:
    env = gpu_env()
    child = start(
        NVML
        + """
pynvml.nvmlDeviceRegisterEvents(handles[1], pynvml.nvmlEventTypeXidCriticalError, events)
emit(ready=True)
step()
got = []
while True:
    event = wait(20)
    if "error" in event:
        break
    got.append(event["xid"])
emit(xids=got, end=event)
""",
        env,
    )
    child.read()
    for xid in range(1000, 1100):
        raise_xid(env["FAKE_GPU_STATE"], 1, xid)
    got = go(child)
    child.finish()
    assert got["xids"] == list(range(1036, 1100))  # FS_XID_RING = 64
    assert got["end"] == {"error": TIMEOUT}


def test_a_lost_gpu_answers_gpu_is_lost_until_restored_and_the_wait_reports_it_once(gpu_env: Env) -> None:
    env = gpu_env()
    child = start(
        NVML
        + """
XID = pynvml.nvmlEventTypeXidCriticalError
for h in handles:
    pynvml.nvmlDeviceRegisterEvents(h, XID, events)
emit(ready=True)
step()
def calls():
    return dict(
        memory=[code(pynvml.nvmlDeviceGetMemoryInfo, h) for h in handles],
        uuid=[code(pynvml.nvmlDeviceGetUUID, h) for h in handles],
        handle=[code(pynvml.nvmlDeviceGetHandleByIndex, i) for i in (0, 1)],
        register=code(pynvml.nvmlDeviceRegisterEvents, handles[0], XID, events),
    )
emit(wait=wait(5000), again=wait(20), **calls())
step()
emit(wait=wait(20), **calls())
""",
        env,
    )
    child.read()
    set_lost(env["FAKE_GPU_STATE"], 0, True)
    lost = go(child)
    assert lost["wait"] == {"error": GPU_IS_LOST}
    assert lost["again"] == {"error": TIMEOUT}  # once per loss, not a busy loop
    assert lost["memory"] == [GPU_IS_LOST, 0]
    assert lost["uuid"] == [GPU_IS_LOST, 0]
    assert lost["handle"] == [GPU_IS_LOST, 0]
    assert lost["register"] == GPU_IS_LOST
    set_lost(env["FAKE_GPU_STATE"], 0, False)
    restored = go(child)
    child.finish()
    assert restored == {
        "wait": {"error": TIMEOUT},
        "memory": [0, 0],
        "uuid": [0, 0],
        "handle": [0, 0],
        "register": 0,
    }


def test_event_types_the_fake_does_not_raise_are_not_supported(gpu_env: Env) -> None:
    env = gpu_env()
    child = start(
        NVML
        + """
emit(ecc=code(pynvml.nvmlDeviceRegisterEvents, handles[0], pynvml.nvmlEventTypeDoubleBitEccError, events),
     free=code(pynvml.nvmlEventSetFree, events))
""",
        env,
    )
    assert child.read() == {"ecc": NOT_SUPPORTED, "free": 0}
    child.finish()


def test_the_helpers_refuse_a_missing_file_and_an_unknown_gpu(gpu_env: Env, tmp_path) -> None:
    with pytest.raises(FakeGpuStateError, match="No such file"):
        raise_xid(tmp_path / "absent", 0, 79)
    env = gpu_env()
    child = start(NVML + "emit(ok=True)\n", env)  # creates the state file
    child.read()
    child.finish()
    with pytest.raises(FakeGpuStateError, match="no GPU 2 \\(it has 2\\)"):
        set_lost(env["FAKE_GPU_STATE"], 2, True)
    (tmp_path / "short").write_bytes(b"x" * 10)
    with pytest.raises(FakeGpuStateError, match="not a state file of version 4"):
        raise_xid(tmp_path / "short", 0, 79)
