package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

const (
	envClaim      = "MANAGER_VGPU_CLAIM_UID"
	slowContainer = "slow"
	namespace     = "conformance"
)

// Claim UIDs. The plugin is told the first three are prepared (--prepared-claim).
var (
	claimA          = "0a0a0a0a-0a0a-4a0a-8a0a-0a0a0a0a0a0a"
	claimB          = "0b0b0b0b-0b0b-4b0b-8b0b-0b0b0b0b0b0b"
	claimBroken     = "0e0e0e0e-0e0e-4e0e-8e0e-0e0e0e0e0e0e" // prepared; TestPluginError makes its dir a file
	claimUnprepared = "0f0f0f0f-0f0f-4f0f-8f0f-0f0f0f0f0f0f"
	preparedClaims  = []string{claimA, claimB, claimBroken}
)

func digest(parts ...interface{}) string {
	sum := sha256.Sum256([]byte(fmt.Sprint(parts...)))
	return hex.EncodeToString(sum[:])
}

// uid is a deterministic UUID-shaped string.
func uid(parts ...interface{}) string {
	h := digest(parts...)
	return h[0:8] + "-" + h[8:12] + "-4" + h[13:16] + "-8" + h[17:20] + "-" + h[20:32]
}

func makePod(tag string, n int, name string) *api.PodSandbox {
	u := uid("pod", tag, n)
	if name == "" {
		name = fmt.Sprintf("%s-%d", tag, n)
	}
	return &api.PodSandbox{
		Id:        digest("sandbox", tag, n),
		Name:      name,
		Uid:       u,
		Namespace: namespace,
		Labels: map[string]string{
			"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace, "io.kubernetes.pod.uid": u,
		},
		Annotations: map[string]string{"kubernetes.io/config.source": "api"},
		Linux:       &api.LinuxPodSandbox{CgroupParent: "kubepods-besteffort-pod" + strings.ReplaceAll(u, "-", "_") + ".slice"},
	}
}

// vgpuEnv is what a vGPU container's env holds after containerd applied the claim's CDI edits.
func vgpuEnv(claim string) []string {
	return []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"LD_PRELOAD=/etc/vgpu-manager/driver/libvgpu-control.so",
		"MANAGER_COMPATIBILITY_MODE=102",
		"MANAGER_VISIBLE_DEVICE_0=GPU-2f3c1b9e-6d0a-4c1e-9f55-1d7e0e8c7a10",
		"CUDA_MEM_LIMIT_0=4096m",
		envClaim + "=" + claim,
	}
}

func plainEnv() []string {
	return []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
}

// adjusted is ctr as the runtime keeps it once a plugin's adjustment is applied (its mounts added,
// its env set), which is what a later Synchronize reports: vgpud checks it there.
func adjusted(ctr *api.Container, adj *api.ContainerAdjustment) *api.Container {
	out := proto.Clone(ctr).(*api.Container)
	if adj == nil {
		return out
	}
	out.Mounts = append(out.Mounts, adj.Mounts...)
	for _, kv := range adj.Env {
		prefix := kv.Key + "="
		env := []string{}
		for _, e := range out.Env {
			if !strings.HasPrefix(e, prefix) {
				env = append(env, e)
			}
		}
		out.Env = append(env, prefix+kv.Value)
	}
	return out
}

func makeContainer(pod *api.PodSandbox, name string, env []string) *api.Container {
	id := digest("container", pod.Id, name)
	return &api.Container{
		Id:           id,
		PodSandboxId: pod.Id,
		Name:         name,
		State:        api.ContainerState_CONTAINER_CREATED,
		Labels: map[string]string{
			"io.kubernetes.container.name": name, "io.kubernetes.pod.name": pod.Name,
			"io.kubernetes.pod.namespace": pod.Namespace, "io.kubernetes.pod.uid": pod.Uid,
		},
		Annotations: map[string]string{"io.kubernetes.container.restartCount": "0"},
		Args:        []string{"/bin/sh", "-c", "sleep infinity"},
		Env:         env,
		Mounts: []*api.Mount{
			{Destination: "/etc/hosts", Type: "bind", Source: "/var/lib/containerd/sandboxes/" + pod.Id + "/hosts",
				Options: []string{"rbind", "rprivate", "rw"}},
		},
		Linux: &api.LinuxContainer{CgroupsPath: "kubepods-besteffort-pod" + pod.Uid + ".slice:cri-containerd:" + id},
	}
}

func createReq(pod *api.PodSandbox, ctr *api.Container) *api.CreateContainerRequest {
	return &api.CreateContainerRequest{Pod: pod, Container: ctr}
}

// syncState is a node with nCtrs running containers, perPod per pod: every 4th container uses the
// prepared claimA, every 8th (offset 1) the unprepared claim, the rest no vGPU. Lean containers, so
// that the message size comes from the count. tracked = the containers the plugin must cache.
func syncState(nCtrs, perPod int) (pods []*api.PodSandbox, ctrs []*api.Container, tracked int) {
	for i := 0; i < nCtrs; i++ {
		if i%perPod == 0 {
			pods = append(pods, &api.PodSandbox{
				Id: digest("sync-sandbox", i/perPod), Name: fmt.Sprintf("sync-%d", i/perPod),
				Uid: uid("sync-pod", i/perPod), Namespace: namespace,
			})
		}
		pod := pods[len(pods)-1]
		env := []string{"PATH=/usr/bin:/bin"}
		switch {
		case i%4 == 0:
			env = append(env, envClaim+"="+claimA)
			tracked++
		case i%8 == 1:
			env = append(env, envClaim+"="+claimUnprepared)
		}
		ctrs = append(ctrs, &api.Container{
			Id: digest("sync-container", i), PodSandboxId: pod.Id, Name: fmt.Sprintf("ctr-%d", i%perPod),
			State: api.ContainerState_CONTAINER_RUNNING, Env: env, Pid: uint32(10000 + i),
			Labels: map[string]string{"io.kubernetes.container.name": fmt.Sprintf("ctr-%d", i%perPod)},
		})
	}
	return pods, ctrs, tracked
}

func syncSize(pods []*api.PodSandbox, ctrs []*api.Container) int {
	return proto.Size(&api.SynchronizeRequest{Pods: pods, Containers: ctrs})
}

// ---------------------------------------------------------------------------------------------
// what the plugin must inject (README.md, "Injection")

func (e *env) containerDir(claim string, pod *api.PodSandbox, ctr string) string {
	return filepath.Join(e.root, "claims", claim, pod.Uid+"_"+ctr)
}

func wantMounts(dir string) []*api.Mount {
	bind := func(src, dst, mode string) *api.Mount {
		return &api.Mount{Source: src, Destination: dst, Type: "bind", Options: []string{mode, "nosuid", "nodev", "bind"}}
	}
	return []*api.Mount{
		bind(filepath.Join(dir, "config"), "/etc/vgpu-manager/config", "rw"),
		bind(filepath.Join(dir, "vgpu_lock"), "/tmp/.vgpu_lock", "rw"),
		bind(filepath.Join(dir, "vmem_node"), "/tmp/.vmem_node", "rw"),
		bind(filepath.Join(dir, "sm_node"), "/tmp/.sm_node", "rw"),
		bind(filepath.Join(dir, "config", "pids.config"), "/etc/vgpu-manager/config/pids.config", "ro"),
	}
}

func wantEnv(pod *api.PodSandbox, ctr string) []*api.KeyValue {
	return []*api.KeyValue{
		{Key: "VGPU_POD_UID", Value: pod.Uid},
		{Key: "VGPU_POD_NAME", Value: pod.Name},
		{Key: "VGPU_POD_NAMESPACE", Value: pod.Namespace},
		{Key: "VGPU_CONTAINER_NAME", Value: ctr},
		{Key: "MANAGER_CLIENT_REGISTER_UUID", Value: ""},
	}
}

// wantResponse is the merged response the runtime must return when the plugin injected.
func (e *env) wantResponse(req *api.CreateContainerRequest, claim string) *api.CreateContainerResponse {
	want := proto.Clone(e.baseline(req)).(*api.CreateContainerResponse)
	want.Adjust.Mounts = wantMounts(e.containerDir(claim, req.Pod, req.Container.Name))
	want.Adjust.Env = wantEnv(req.Pod, req.Container.Name)
	return want
}

// canonical sorts mounts by destination and env by key, after checking the one order that
// matters: the read-only pids.config file mount nests inside the config dir mount, so it must
// come after it.
func canonical(t testing.TB, resp *api.CreateContainerResponse) *api.CreateContainerResponse {
	t.Helper()
	resp = proto.Clone(resp).(*api.CreateContainerResponse)
	adj := resp.GetAdjust()
	if adj == nil {
		return resp
	}
	cfg, pids := -1, -1
	for i, m := range adj.Mounts {
		switch m.Destination {
		case "/etc/vgpu-manager/config":
			cfg = i
		case "/etc/vgpu-manager/config/pids.config":
			pids = i
		}
	}
	if cfg >= 0 && pids >= 0 && pids < cfg {
		t.Errorf("the pids.config file mount (#%d) comes before the config dir mount (#%d): the dir mount would hide it", pids, cfg)
	}
	sort.SliceStable(adj.Mounts, func(i, j int) bool { return adj.Mounts[i].Destination < adj.Mounts[j].Destination })
	sort.SliceStable(adj.Env, func(i, j int) bool { return adj.Env[i].Key < adj.Env[j].Key })
	return resp
}

func diffResponses(t testing.TB, want, got *api.CreateContainerResponse) string {
	const maxDiff = 16 << 10 // the large-adjustment cases would print megabytes
	d := cmp.Diff(canonical(t, want), canonical(t, got), protocmp.Transform())
	if len(d) > maxDiff {
		d = fmt.Sprintf("%s\n... (%d more bytes of diff)", d[:maxDiff], len(d)-maxDiff)
	}
	return d
}

// expectInjected checks the runtime's merged response and the directories on disk.
func (e *env) expectInjected(t testing.TB, req *api.CreateContainerRequest, resp *api.CreateContainerResponse, err error, claim string) {
	t.Helper()
	if err != nil {
		t.Fatalf("CreateContainer %s/%s (claim %s): the runtime returned an error: %v\n%s",
			req.Pod.Name, req.Container.Name, claim, err, e.tr.diagnostics())
	}
	if d := diffResponses(t, e.wantResponse(req, claim), resp); d != "" {
		t.Fatalf("CreateContainer %s (claim %s): the runtime's merged response is not the injection of "+
			"README.md (-want +got, mounts sorted by destination, env by key):\n%s", req.Container.Name, claim, d)
	}
	e.expectDirs(t, e.containerDir(claim, req.Pod, req.Container.Name))
}

func (e *env) expectDirs(t testing.TB, dir string) {
	t.Helper()
	for _, sub := range []string{"config", "vgpu_lock", "vmem_node", "sm_node"} {
		fi, err := os.Lstat(filepath.Join(dir, sub))
		if err != nil || !fi.IsDir() {
			t.Errorf("%s/%s: want a directory made by the plugin before it answered: %v", dir, sub, describe(fi, err))
		}
	}
	pids := filepath.Join(dir, "config", "pids.config")
	fi, err := os.Lstat(pids)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
		t.Errorf("%s: want an empty regular file: %v", pids, describe(fi, err))
	}
}

func describe(fi os.FileInfo, err error) string {
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%s, %d bytes", fi.Mode(), fi.Size())
}

func inode(t testing.TB, path string) uint64 {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// expectUntouched checks that the plugin changed nothing: the merged response equals the one of a
// runtime without plugins.
func (e *env) expectUntouched(t testing.TB, req *api.CreateContainerRequest, resp *api.CreateContainerResponse, err error, why string) {
	t.Helper()
	if err != nil {
		t.Fatalf("CreateContainer %s (%s): want success without adjustment, got error: %v", req.Container.Name, why, err)
	}
	if d := diffResponses(t, e.baseline(req), resp); d != "" {
		t.Fatalf("CreateContainer %s (%s): want no adjustment, the runtime's merged response differs from "+
			"a runtime without plugins (-want +got):\n%s", req.Container.Name, why, d)
	}
}

// replyFrame is the size of the ttrpc frame (10-byte header + ttrpc.Response{payload=2}) that
// carries a CreateContainerResponse of n bytes.
func replyFrame(n int) int {
	return 10 + 1 + protowire.SizeVarint(uint64(n)) + n
}

// ---------------------------------------------------------------------------------------------
// --sync-report

type syncReport struct {
	Pods       int `json:"pods"`
	Containers int `json:"containers"`
	Tracked    int `json:"tracked"`
}

func (e *env) syncReports() ([]syncReport, error) {
	f, err := os.Open(e.report)
	if os.IsNotExist(err) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []syncReport
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r syncReport
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return out, fmt.Errorf("--sync-report line %q: %w", sc.Text(), err)
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// expectSyncReport waits for the plugin's n-th --sync-report line and compares it.
func (e *env) expectSyncReport(n int, want syncReport) {
	e.t.Helper()
	var got []syncReport
	var err error
	e.waitFor(fmt.Sprintf("line #%d of the plugin's --sync-report file %s", n, e.report), 10*time.Second, func(*tracker) bool {
		got, err = e.syncReports()
		return err != nil || len(got) >= n
	})
	if err != nil {
		e.t.Fatal(err)
	}
	if got[n-1] != want {
		e.t.Fatalf("the plugin's report of Synchronize #%d: got %+v, want %+v (tracked = containers with a prepared claim)", n, got[n-1], want)
	}
}
