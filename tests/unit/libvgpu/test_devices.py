"""A vGPU container sees exactly its allocated GPUs: when the library is configured, a GPU whose UUID
it was not given is refused at every door that names a device (cuDeviceGet, context creation by any
ordinal, NVML handle lookups), through the application's import, dlsym and cuGetProcAddress(_v2),
and gets no memory even from a context that exists anyway; the container's own GPUs work and stay
limited. Counts stay the driver's. A library with no device configured is inert: everything passes
as without it. Real processes on the fake driver + NVML (two GPUs), and on driver/NVML doubles for
the doors the fakes lack."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support import built
from tests.unit.libvgpu.cbuild import compile_c, library_dirs, preload_env
from tests.unit.libvgpu.conftest import MIB, PHYSICAL, UUIDS, Container, build_probe, parse

SUCCESS = "0"
OUT_OF_MEMORY = "2"
INVALID_DEVICE = "101"
NVML_NOT_FOUND = "6"
LIMIT = 1024 * MIB
#: cuDeviceGet and cuDevicePrimaryCtxRetain: every door
DOORS = ("direct", "dlsym", "gpa", "gpa2", "gpa2ptsz")
#: cuCtxCreate's variants and their doors (the profile's 12.4 driver has no v4 through cuGetProcAddress)
CREATES = [(v, d) for v in ("v1", "v2", "v3") for d in DOORS] + [("v4", "direct"), ("v4", "dlsym")]


def refusal_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("vgpu: warning: refused device ")]


def refusal(uuid: str) -> str:
    """The one line a refused GPU gets (LOGGER_LEVEL warning, the default)."""
    return f"vgpu: warning: refused device {uuid}: not one of this container's devices"


@pytest.fixture(scope="session")
def devprobe(tmp_path_factory: pytest.TempPathFactory, fakes: tuple[Path, Path]) -> Path:
    return build_probe(tmp_path_factory, fakes, "devprobe")


def probe(
    container: Container, devprobe: Path, chunk: int, preload: bool = True, **extra: str
) -> tuple[dict[str, str], str]:
    proc = subprocess.run(
        [str(devprobe), str(chunk), *UUIDS],
        env=container.environ(preload, **extra),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return parse(proc.stdout), proc.stderr


def expected(i: int, *, ok: bool) -> dict[str, str]:
    """What every door answers for ordinal / index i: success when the GPU may be used; else the
    error, and nothing handed out, retained, created or made current."""
    cuda = SUCCESS if ok else INVALID_DEVICE
    nvml = SUCCESS if ok else NVML_NOT_FOUND
    untouched = "0" if ok else "1"  # the probe's flag: 1 when the output was left as it was
    want = {"count": "2", "nvml.count": "2"}
    for door in DOORS:
        want |= {f"get.{door}.{i}": cuda, f"get.{door}.{i}.d": str(i) if ok else "-7"}
        want |= {
            f"retain.{door}.{i}": cuda,
            f"retain.{door}.{i}.active": "1" if ok else "0",
            f"retain.{door}.{i}.ctx": untouched,
        }
    for variant, door in CREATES:
        key = f"create.{variant}.{door}.{i}"
        want |= {key: cuda, f"{key}.ctx": untouched, f"{key}.current": untouched}
    for call in ("index", "index_v2", "uuid"):
        want |= {f"nvml.{call}.{i}": nvml, f"nvml.{call}.{i}.h": untouched}
    return want


def subset(got: dict[str, str], want: dict[str, str]) -> dict[str, tuple[str | None, str]]:
    """The keys where `got` differs from `want`: key -> (got, wanted)."""
    return {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}


def test_a_gpu_not_configured_is_refused_at_every_door(container: Container, devprobe: Path) -> None:
    got, stderr = probe(
        container, devprobe, 128 * MIB, MANAGER_VISIBLE_DEVICES=UUIDS[0], CUDA_MEM_LIMIT_0="1024m"
    )
    assert subset(got, expected(1, ok=False)) == {}
    # GPU 0 works, and is limited (the CUDA and NVML views too).
    assert subset(got, expected(0, ok=True)) == {}
    assert (got["fill.count"], got["fill.error"]) == ("8", OUT_OF_MEMORY)
    assert got["nvml.total.0"] == str(LIMIT) and "nvml.total.1" not in got
    # One line for the refused GPU, however many doors refused it; none for ours.
    assert refusal_lines(stderr) == [refusal(UUIDS[1])]


def test_the_refused_gpu_is_any_gpu_the_library_was_not_given(container: Container, devprobe: Path) -> None:
    """GPU 1 configured, GPU 0 not (CUDA ordinal 0, NVML index 0): the gate goes by UUID."""
    del container.env["MANAGER_VISIBLE_DEVICES"]
    got, stderr = probe(
        container, devprobe, 128 * MIB, MANAGER_VISIBLE_DEVICE_1=UUIDS[1], CUDA_MEM_LIMIT_1="512m"
    )
    assert subset(got, expected(0, ok=False)) == {}
    assert subset(got, expected(1, ok=True)) == {}
    assert got["nvml.total.1"] == str(512 * MIB)
    assert "fill.count" not in got  # ordinal 0 is not the container's: no context, no memory
    assert refusal_lines(stderr) == [refusal(UUIDS[0])]


def test_both_gpus_configured_both_work(container: Container, devprobe: Path) -> None:
    got, stderr = probe(container, devprobe, 128 * MIB, CUDA_MEM_LIMIT_0="1024m", CUDA_MEM_LIMIT_1="512m")
    assert subset(got, expected(0, ok=True) | expected(1, ok=True)) == {}
    assert (got["fill.count"], got["fill.error"]) == ("8", OUT_OF_MEMORY)
    assert (got["nvml.total.0"], got["nvml.total.1"]) == (str(LIMIT), str(512 * MIB))
    assert refusal_lines(stderr) == []


@pytest.mark.parametrize("visible", [None, "void", "all"])
def test_no_device_configured_is_inert(container: Container, devprobe: Path, visible: str | None) -> None:
    """Loaded with no device (not a vGPU container): every door answers as without the library, and
    a limit variable alone limits nothing."""
    del container.env["MANAGER_VISIBLE_DEVICES"]
    extra = {"CUDA_MEM_LIMIT": "1024m"} | ({"NVIDIA_VISIBLE_DEVICES": visible} if visible is not None else {})
    got, stderr = probe(container, devprobe, 4096 * MIB, **extra)
    assert subset(got, expected(0, ok=True) | expected(1, ok=True)) == {}
    assert got["fill.count"] == str(PHYSICAL // (4096 * MIB))
    assert refusal_lines(stderr) == []
    plain, _ = probe(container, devprobe, 4096 * MIB, preload=False, **extra)
    assert got == plain


# --- doubles: a context that exists anyway, and the doors the fakes lack ---------------------------


def _uuid_bytes(uuid: str) -> str:
    hexed = uuid[4:].replace("-", "")
    return "{" + ", ".join(f"0x{hexed[i : i + 2]}" for i in range(0, 32, 2)) + "}"


#: two devices; `double_use(dev)` makes a context on `dev` current as if one existed anyway (the
#: library does not hook it: not a cu* name); every allocation succeeds, so a refusal is the library's
DRIVER = (
    r"""
#include <stdlib.h>
#include <string.h>
typedef unsigned long long u64;
static const unsigned char U[2][16] = {"""
    + _uuid_bytes(UUIDS[0])
    + ", "
    + _uuid_bytes(UUIDS[1])
    + r"""};
static int current = -1;
void double_use(int dev) { current = dev; }
int cuInit(unsigned f) { (void)f; return 0; }
int cuDriverGetVersion(int *v) { *v = 12040; return 0; }
int cuDeviceGetCount(int *n) { *n = 2; return 0; }
int cuDeviceGet(int *d, int o) { if (o < 0 || o > 1) return 101; *d = o; return 0; }
int cuDeviceGetByPCIBusId(int *d, const char *bus) {
    if (strcmp(bus, "0000:01:00.0") == 0) { *d = 0; return 0; }
    if (strcmp(bus, "0000:02:00.0") == 0) { *d = 1; return 0; }
    return 101;
}
int cuDeviceGetUuid_v2(unsigned char *u, int d) {
    if (d < 0 || d > 1) return 101;
    memcpy(u, U[d], 16);
    return 0;
}
int cuCtxGetDevice(int *d) { if (current < 0) return 201; *d = current; return 0; }
int cuGreenCtxCreate(void **c, void *desc, int dev, unsigned f) {
    (void)desc; (void)f; if (dev < 0 || dev > 1) return 101; *c = (void *)0x9; current = dev; return 0;
}
int cuMemAlloc_v2(u64 *p, size_t n) { (void)n; *p = 0x1000; return 0; }
int cuMemAlloc(unsigned *p, unsigned n) { (void)n; *p = 0x1000; return 0; }
int cuMemAllocPitch_v2(u64 *p, size_t *pitch, size_t w, size_t h, unsigned e) {
    (void)h; (void)e; *pitch = w; *p = 0x1000; return 0;
}
int cuMemAllocManaged(u64 *p, size_t n, unsigned f) { (void)n; (void)f; *p = 0x2000; return 0; }
int cuMemAllocAsync(u64 *p, size_t n, void *s) { (void)n; (void)s; *p = 0x1000; return 0; }
int cuMemAllocFromPoolAsync(u64 *p, size_t n, void *pool, void *s) {
    (void)n; (void)pool; (void)s; *p = 0x1000; return 0;
}
int cuMemCreate(u64 *h, size_t n, const void *prop, u64 f) { (void)n; (void)prop; (void)f; *h = 7; return 0; }
int cuArrayCreate_v2(void **a, const void *desc) { (void)desc; *a = (void *)0x3; return 0; }
int cuMemHostAlloc(void **pp, size_t n, unsigned f) { (void)f; *pp = malloc(n); return 0; }
int cuMemHostRegister_v2(void *p, size_t n, unsigned f) { (void)p; (void)n; (void)f; return 0; }
int cuMemGetInfo_v2(size_t *fr, size_t *t) { *fr = *t = (size_t)1 << 30; return 0; }
int cuDeviceTotalMem_v2(size_t *b, int d) { (void)d; *b = (size_t)1 << 30; return 0; }
"""
)

#: two GPUs with the same UUIDs; `double_handle(i)` hands out a raw handle (not an nvml* name)
NVML = (
    r"""
#include <string.h>
static const char *const UUID[2] = {"""
    + f'"{UUIDS[0]}", "{UUIDS[1]}"'
    + r"""};
static const char *const BUS[2] = {"0000:01:00.0", "0000:02:00.0"};
static const char *const SERIAL[2] = {"1320000000001", "1320000000002"};
static int dev[2];
typedef struct { unsigned version, type; char str[96]; } uuidv_t;
typedef struct { unsigned long long total, free, used; } mem_t;
void *double_handle(int i) { return &dev[i]; }
static int find(const char *const *keys, const char *key, void **h) {
    for (int i = 0; i < 2; i++) if (strcmp(keys[i], key) == 0) { *h = &dev[i]; return 0; }
    return 6;
}
static int fill(unsigned *count, void **list) {
    if (*count == 0) { *count = 2; return 0; }
    unsigned n = *count < 2 ? *count : 2;
    for (unsigned i = 0; i < n; i++) list[i] = &dev[i];
    *count = n;
    return 0;
}
int nvmlInit_v2(void) { return 0; }
int nvmlInitWithFlags(unsigned f) { (void)f; return 0; }
int nvmlDeviceGetCount_v2(unsigned *n) { *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) { if (i > 1) return 2; *h = &dev[i]; return 0; }
int nvmlDeviceGetHandleByUUID(const char *u, void **h) { return find(UUID, u, h); }
int nvmlDeviceGetHandleByUUIDV(const uuidv_t *u, void **h) { return find(UUID, u->str, h); }
int nvmlDeviceGetHandleByPciBusId_v2(const char *b, void **h) { return find(BUS, b, h); }
int nvmlDeviceGetHandleByPciBusId(const char *b, void **h) { return find(BUS, b, h); }
int nvmlDeviceGetHandleBySerial(const char *s, void **h) { return find(SERIAL, s, h); }
int nvmlDeviceGetUUID(void *h, char *out, unsigned len) {
    int i = (int *)h - dev;
    if (i < 0 || i > 1) return 2;
    strncpy(out, UUID[i], len);
    return 0;
}
int nvmlDeviceGetTopologyNearestGpus(void *h, int level, unsigned *count, void **list) {
    (void)h; (void)level; return fill(count, list);
}
int nvmlSystemGetTopologyGpuSet(unsigned cpu, unsigned *count, void **list) {
    (void)cpu; return fill(count, list);
}
int nvmlUnitGetDevices(void *unit, unsigned *count, void **list) { (void)unit; return fill(count, list); }
int nvmlDeviceGetMemoryInfo(void *h, mem_t *m) {
    (void)h; m->total = 1ULL << 30; m->used = 0; m->free = m->total; return 0;
}
"""
)

CALLER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
typedef int (*fn_t)();
static void *cuda, *nvml;
static fn_t cu(const char *name) { return (fn_t)dlsym(cuda, name); }
static fn_t nv(const char *name) { return (fn_t)dlsym(nvml, name); }
typedef struct { int type, handle_types, loc_type, loc_id; void *win32; unsigned char flags[8]; } prop_t;
typedef struct { size_t w, h; int format; unsigned channels; } desc_t;
typedef struct { unsigned version, type; char str[96]; } uuidv_t;

static int which(void *h) {
    for (int i = 0; i < 2; i++) if (h == ((void *(*)(int))dlsym(nvml, "double_handle"))(i)) return i;
    return -1;
}
static void list(const char *key, int rc, unsigned count, void **l) {
    printf("%s %d %u", key, rc, count);
    for (unsigned i = 0; i < count; i++) printf(" %d", which(l[i]));
    printf("\n");
}

int main(void) {
    cuda = dlopen("libcuda.so.1", RTLD_NOW);
    nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    void (*use)(int) = (void (*)(int))dlsym(cuda, "double_use");
    cu("cuInit")(0);
    for (int d = 0; d < 2; d++) {
        unsigned long long p; unsigned p32; size_t pitch, f, t; void *a, *h = NULL; int x = 0;
        use(d);
        printf("alloc.%d %d\n", d, cu("cuMemAlloc_v2")(&p, (size_t)1 << 20));
        printf("alloc_v1.%d %d\n", d, cu("cuMemAlloc")(&p32, 1u << 20));
        printf("pitch.%d %d\n", d, cu("cuMemAllocPitch_v2")(&p, &pitch, (size_t)1024, (size_t)1024, 4u));
        printf("managed.%d %d\n", d, cu("cuMemAllocManaged")(&p, (size_t)1 << 20, 1u));
        printf("async.%d %d\n", d, cu("cuMemAllocAsync")(&p, (size_t)1 << 20, NULL));
        printf("pool.%d %d\n", d, cu("cuMemAllocFromPoolAsync")(&p, (size_t)1 << 20, NULL, NULL));
        desc_t desc = {256, 256, 0x20, 1};
        printf("array.%d %d\n", d, cu("cuArrayCreate_v2")(&a, &desc));
        printf("hostalloc.%d %d\n", d, cu("cuMemHostAlloc")(&h, (size_t)4096, 0u));
        printf("register.%d %d\n", d, cu("cuMemHostRegister_v2")(&x, sizeof x, 0u));
        printf("meminfo.%d %d\n", d, cu("cuMemGetInfo_v2")(&f, &t));
        printf("totalmem.%d %d\n", d, cu("cuDeviceTotalMem_v2")(&t, d));
        /* cuMemCreate goes by the location it names, not the current context (ours here) */
        use(0);
        prop_t prop = {1, 0, 1, d, NULL, {0}};
        printf("create.%d %d\n", d, cu("cuMemCreate")(&p, (size_t)1 << 21, &prop, 0ULL));
    }
    const char *bus[2] = {"0000:01:00.0", "0000:02:00.0"};
    const char *serial[2] = {"1320000000001", "1320000000002"};
    const char *uuid[2] = {"__UUID0__", "__UUID1__"};
    for (int d = 0; d < 2; d++) {
        int dev = -7; void *ctx = (void *)0x5e47, *h = (void *)0x5e47;
        int r = cu("cuDeviceGetByPCIBusId")(&dev, bus[d]);
        printf("pcibus.%d %d %d\n", d, r, dev);
        use(-1);
        r = cu("cuGreenCtxCreate")(&ctx, NULL, d, 0u);
        printf("green.%d %d %d\n", d, r, ctx == (void *)0x5e47);
        r = nv("nvmlDeviceGetHandleByPciBusId_v2")(bus[d], &h);
        printf("nvml.pci_v2.%d %d %d\n", d, r, which(h));
        h = (void *)0x5e47;
        r = nv("nvmlDeviceGetHandleByPciBusId")(bus[d], &h);
        printf("nvml.pci.%d %d %d\n", d, r, which(h));
        h = (void *)0x5e47;
        r = nv("nvmlDeviceGetHandleBySerial")(serial[d], &h);
        printf("nvml.serial.%d %d %d\n", d, r, which(h));
        h = (void *)0x5e47;
        uuidv_t u = {0x1000034, 1, ""};
        strcpy(u.str, uuid[d]);
        r = nv("nvmlDeviceGetHandleByUUIDV")(&u, &h);
        printf("nvml.uuidv.%d %d %d\n", d, r, which(h));
        struct { unsigned long long total, free, used; } m = {0, 0, 0};
        void *raw = ((void *(*)(int))dlsym(nvml, "double_handle"))(d);
        printf("nvml.mem.%d %d\n", d, nv("nvmlDeviceGetMemoryInfo")(raw, &m));
    }
    void *l[4];
    unsigned n = 0;
    int r = nv("nvmlDeviceGetTopologyNearestGpus")(NULL, 0, &n, l);
    printf("nvml.nearest.query %d %u\n", r, n);
    n = 4; r = nv("nvmlDeviceGetTopologyNearestGpus")(NULL, 0, &n, l); list("nvml.nearest", r, n, l);
    n = 4; r = nv("nvmlSystemGetTopologyGpuSet")(0u, &n, l); list("nvml.gpuset", r, n, l);
    n = 4; r = nv("nvmlUnitGetDevices")(NULL, &n, l); list("nvml.unit", r, n, l);
    return 0;
}
""".replace("__UUID0__", UUIDS[0]).replace("__UUID1__", UUIDS[1])

#: the caller's allocation doors, each printed per device
ALLOC_KINDS = (
    "alloc",
    "alloc_v1",
    "pitch",
    "managed",
    "async",
    "pool",
    "array",
    "hostalloc",
    "register",
    "create",
)
#: what the caller prints for device d when it may be used
DOUBLE_USABLE = {
    **{f"{k}.{d}": SUCCESS for d in (0, 1) for k in (*ALLOC_KINDS, "meminfo", "totalmem")},
    **{f"pcibus.{d}": f"0 {d}" for d in (0, 1)},
    **{f"green.{d}": "0 0" for d in (0, 1)},
    **{f"nvml.{k}.{d}": f"0 {d}" for d in (0, 1) for k in ("pci_v2", "pci", "serial", "uuidv")},
    **{f"nvml.mem.{d}": SUCCESS for d in (0, 1)},
    "nvml.nearest.query": "0 2",
    "nvml.nearest": "0 2 0 1",
    "nvml.gpuset": "0 2 0 1",
    "nvml.unit": "0 2 0 1",
}


def run_doubles(tmp_path: Path, **extra: str) -> tuple[dict[str, str], str]:
    lib = built("libvgpu/libvgpu-control.so")
    compile_c(tmp_path / "libcuda.so.1", DRIVER, "-Wl,-soname,libcuda.so.1", shared=True)
    compile_c(tmp_path / "libnvidia-ml.so.1", NVML, "-Wl,-soname,libnvidia-ml.so.1", shared=True)
    caller = compile_c(tmp_path / "caller", CALLER)
    env = preload_env(
        lib, LD_LIBRARY_PATH=str(tmp_path), VGPU_PROC="/proc", **library_dirs(tmp_path), **extra
    )
    proc = subprocess.run([str(caller)], env=env, capture_output=True, text=True, check=False, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dict(line.split(" ", 1) for line in proc.stdout.splitlines()), proc.stderr


def test_a_context_on_a_gpu_not_configured_gets_nothing(tmp_path: Path) -> None:
    """A context on GPU 1 that exists anyway (made current by the double, past every gate): no
    allocation of any kind, no memory view; the other device-naming doors refuse GPU 1 too."""
    got, stderr = run_doubles(tmp_path, MANAGER_VISIBLE_DEVICES=UUIDS[0])
    want = DOUBLE_USABLE | {
        **{f"{k}.1": OUT_OF_MEMORY for k in ALLOC_KINDS},
        "meminfo.1": INVALID_DEVICE,
        "totalmem.1": INVALID_DEVICE,
        "pcibus.1": f"{INVALID_DEVICE} -7",
        "green.1": f"{INVALID_DEVICE} 1",
        **{f"nvml.{k}.1": f"{NVML_NOT_FOUND} -1" for k in ("pci_v2", "pci", "serial", "uuidv")},
        "nvml.mem.1": NVML_NOT_FOUND,
        "nvml.nearest.query": "0 2",  # a size query: the driver's count, a bound
        "nvml.nearest": "0 1 0",
        "nvml.gpuset": "0 1 0",
        "nvml.unit": "0 1 0",
    }
    assert subset(got, want) == {}
    assert refusal_lines(stderr) == [refusal(UUIDS[1])]


def test_the_doubles_without_configuration_pass_everything(tmp_path: Path) -> None:
    got, stderr = run_doubles(tmp_path)
    assert subset(got, DOUBLE_USABLE) == {}
    assert refusal_lines(stderr) == []
