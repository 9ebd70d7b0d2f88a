package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// requiredEvents are what the plugin must subscribe to: creation to inject, and the events that
// make a container's directory garbage (DESIGN.md §5), start and stop for the hot-plug's targets.
var requiredEvents = []api.Event{
	api.Event_CREATE_CONTAINER, api.Event_REMOVE_CONTAINER, api.Event_STOP_POD_SANDBOX,
	api.Event_POST_START_CONTAINER, api.Event_STOP_CONTAINER,
}

func smallState() ([]*api.PodSandbox, []*api.Container) {
	p1, p2 := makePod("running", 1, ""), makePod("running", 2, "")
	return []*api.PodSandbox{p1, p2}, []*api.Container{
		makeContainer(p1, "app", vgpuEnv(claimA)),
		makeContainer(p1, "sidecar", plainEnv()),
		makeContainer(p2, "app", vgpuEnv(claimUnprepared)),
	}
}

func startSmall(t *testing.T) *env {
	pods, ctrs := smallState()
	e := newEnv(t, envOptions{pods: pods, ctrs: ctrs})
	e.waitConnected(1, connectTimeout)
	return e
}

// TestRegisterAndConfigure: the plugin registers as 00-manager.nvidia.com, answers Configure with an
// event mask this runtime accepts, is synchronized, added, and stays connected; events reach it.
func TestRegisterAndConfigure(t *testing.T) {
	e := startSmall(t)
	var (
		regs []registerRecord
		cfgs []configureRecord
	)
	e.tr.get(func(tr *tracker) { regs, cfgs = tr.registers, tr.configures })
	if len(regs) != 1 || regs[0].name != pluginName || regs[0].idx != pluginIdx {
		t.Fatalf("RegisterPlugin: got %+v, want exactly one with name %q, idx %q", regs, pluginName, pluginIdx)
	}
	t.Logf("RegisterPlugin: name %q, idx %q, %s", regs[0].name, regs[0].idx, regs[0].detail)
	if len(cfgs) != 1 || cfgs[0].code != codes.OK {
		t.Fatalf("Configure: want one successful call, got %+v", cfgs)
	}
	mask := cfgs[0].events
	t.Logf("Configure: %s; the plugin subscribed to 0x%x (%s); this runtime knows 0x%x", cfgs[0].detail, mask, eventNames(mask), int32(api.ValidEvents))
	if extra := api.EventMask(mask) &^ api.ValidEvents; extra != 0 {
		t.Errorf("Configure: events 0x%x are unknown to this runtime (it accepted them?)", int32(extra))
	}
	for _, ev := range requiredEvents {
		if m := api.EventMask(mask); mask != 0 && !m.IsSet(ev) {
			t.Errorf("Configure: the plugin did not subscribe to %v (mask 0x%x)", ev, mask)
		}
	}
	pods, ctrs := smallState()
	e.expectSyncReport(1, syncReport{Pods: len(pods), Containers: len(ctrs), Tracked: 1})

	time.Sleep(500 * time.Millisecond)
	e.tr.get(func(tr *tracker) {
		if tr.closed != 0 || len(tr.dropped) != 0 || tr.connected != 1 {
			t.Errorf("the plugin did not stay connected: %d connections, %d closes, drops %q", tr.connected, tr.closed, tr.dropped)
		}
		if havePluginCount && tr.pluginCount != 1 {
			t.Errorf("the runtime counts %d active plugins, want 1", tr.pluginCount)
		}
	})
	req := createReq(makePod("reg", 1, ""), nil)
	req.Container = makeContainer(req.Pod, "app", vgpuEnv(claimA))
	resp, err := e.create(req)
	e.expectInjected(t, req, resp, err, claimA)
}

// TestSynchronizeLarge: 20,000 containers, over 4 MiB: a runtime that splits (v0.7+) sends several
// chunks with more=true; the plugin answers each, sees every container, stays connected, and a
// CreateContainer afterwards is injected. v0.6.1 cannot split: there the largest state that fits
// in one message is synchronized instead (TestOversizedSynchronize covers what happens above it).
func TestSynchronizeLarge(t *testing.T) {
	const total = 20000
	pods, ctrs, tracked := syncState(total, 5)
	size := syncSize(pods, ctrs)
	if size <= 4<<20 {
		t.Fatalf("harness: %d containers make %d bytes, not over 4 MiB", total, size)
	}
	if !splitSync {
		t.Logf("NRI %s has no split Synchronize (added in v0.7.0): a state over 4 MiB cannot be synchronized "+
			"by this runtime at all; checking the largest state that fits in one message instead", moduleVersion("github.com/containerd/nri"))
		n := total
		for syncSize(pods, ctrs) > 4<<20-64<<10 {
			n = n * 9 / 10
			pods, ctrs, tracked = syncState(n, 5)
		}
		size = syncSize(pods, ctrs)
	}
	t.Logf("state: %d pods, %d containers, %d of them with a prepared claim; SynchronizeRequest %.2f MiB",
		len(pods), len(ctrs), tracked, float64(size)/(1<<20))
	e := newEnv(t, envOptions{pods: pods, ctrs: ctrs})
	e.waitFor("the runtime's first Synchronize to finish", connectTimeout, func(tr *tracker) bool {
		return len(tr.syncs) > 0 && tr.syncs[0].done
	})
	var rec syncRecord
	e.tr.get(func(tr *tracker) { rec = *tr.syncs[0] })
	if rec.err != nil {
		t.Fatalf("the Synchronize failed after %s with %d chunk(s) answered: %v\n(all chunks share one request "+
			"timeout, %s by default in containerd; the runtime closes a plugin whose sync fails)\n%s",
			rec.dur.Round(time.Millisecond), len(rec.chunks), rec.err, defaultRequestTimeout, e.tr.diagnostics())
	}
	e.waitConnected(1, connectTimeout)
	t.Logf("Synchronize took %s: %d chunk(s) of %v bytes answered by the plugin (%d message(s) over 4 MiB refused by the runtime's ttrpc, then split)",
		rec.dur.Round(time.Millisecond), len(rec.chunks), rec.chunks, rec.refused)
	if splitSync && len(rec.chunks) < 2 {
		t.Errorf("want a split Synchronize (several chunks), the runtime sent %d", len(rec.chunks))
	}
	if !splitSync && len(rec.chunks) != 1 {
		t.Errorf("want one Synchronize message, the runtime sent %d", len(rec.chunks))
	}
	e.expectSyncReport(1, syncReport{Pods: len(pods), Containers: len(ctrs), Tracked: tracked})
	req := createReq(makePod("after-sync", 1, ""), nil)
	req.Container = makeContainer(req.Pod, "app", vgpuEnv(claimA))
	resp, err := e.create(req)
	e.expectInjected(t, req, resp, err, claimA)
	e.tr.get(func(tr *tracker) {
		if tr.closed != 0 || tr.connected != 1 {
			t.Errorf("the plugin did not stay connected: %d connections, %d closes", tr.connected, tr.closed)
		}
	})
}

// TestOversizedSynchronize (v0.6.1): the runtime sends a Synchronize over 4 MiB in one message
// (ttrpc v1.2.5 does not refuse to send it). The runtime cannot synchronize such a node whatever the
// plugin does; the plugin must neither crash nor hang: it answers RESOURCE_EXHAUSTED on that stream
// as Go's ttrpc server does (nri-protocol.md §1), or drops the connection as the v0.12 Go mux does
// (its frame limit is 4 MiB + 10), so the sync fails fast, and the process lives on.
func TestOversizedSynchronize(t *testing.T) {
	if splitSync {
		t.Skipf("NRI %s splits a Synchronize over 4 MiB (TestSynchronizeLarge): it never sends an oversized one",
			moduleVersion("github.com/containerd/nri"))
	}
	pods, ctrs, _ := syncState(20000, 5)
	t.Logf("state: %d containers, SynchronizeRequest %.2f MiB, sent unsplit by this runtime", len(ctrs), float64(syncSize(pods, ctrs))/(1<<20))
	e := newEnv(t, envOptions{pods: pods, ctrs: ctrs})
	e.waitFor("the runtime's Synchronize to finish", connectTimeout, func(tr *tracker) bool {
		return len(tr.syncs) > 0 && tr.syncs[0].done
	})
	var rec syncRecord
	e.tr.get(func(tr *tracker) { rec = *tr.syncs[0] })
	switch {
	case rec.err == nil:
		t.Errorf("the oversized Synchronize succeeded?")
	case isStatus(rec.err, codes.ResourceExhausted):
		t.Logf("the plugin answered RESOURCE_EXHAUSTED after %s and keeps the connection (the runtime will not add it): %v",
			rec.dur.Round(time.Millisecond), rec.err)
	case errors.Is(rec.err, context.DeadlineExceeded) || isStatus(rec.err, codes.DeadlineExceeded) || rec.dur >= defaultRequestTimeout:
		t.Errorf("the plugin did not answer the oversized Synchronize (%v after %s): want RESOURCE_EXHAUSTED or a closed connection",
			rec.err, rec.dur.Round(time.Millisecond))
	default:
		t.Logf("the plugin dropped the connection after %s (%v); it will reconnect and meet the same state", rec.dur.Round(time.Millisecond), rec.err)
	}
	time.Sleep(500 * time.Millisecond)
	if !e.plugin.alive() {
		t.Errorf("the plugin process exited after an oversized message: %v", e.plugin.waitErr)
	}
}

// TestCreateContainer: a prepared claim gets exactly the mounts and env of README.md and its
// directories; no claim, an empty claim and an unprepared claim get no adjustment and no directory.
func TestCreateContainer(t *testing.T) {
	e := startSmall(t)
	pod := makePod("create", 1, "")

	t.Run("prepared claim", func(t *testing.T) {
		req := createReq(pod, makeContainer(pod, "app", vgpuEnv(claimA)))
		resp, err := e.create(req)
		e.expectInjected(t, req, resp, err, claimA)
	})
	t.Run("second claim, second container", func(t *testing.T) {
		req := createReq(pod, makeContainer(pod, "worker", vgpuEnv(claimB)))
		resp, err := e.create(req)
		e.expectInjected(t, req, resp, err, claimB)
	})
	t.Run("pids.config is reset in place", func(t *testing.T) {
		req := createReq(pod, makeContainer(pod, "restarted", vgpuEnv(claimA)))
		dir := e.containerDir(claimA, pod, "restarted")
		pids := filepath.Join(dir, "config", "pids.config")
		if err := os.MkdirAll(filepath.Dir(pids), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(pids, []byte("4242\n4343\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		before := inode(t, pids)
		resp, err := e.create(req)
		e.expectInjected(t, req, resp, err, claimA)
		if after := inode(t, pids); after != before {
			t.Errorf("pids.config was replaced (inode %d -> %d): it must be truncated in place, a bind mount pins the inode", before, after)
		}
	})
	for _, c := range []struct{ name, why string }{
		{"no-claim", "no " + envClaim + " in env"},
		{"empty-claim", envClaim + " is empty"},
		{"unprepared", "claim " + claimUnprepared + " is not prepared"},
	} {
		t.Run(c.why, func(t *testing.T) {
			env := plainEnv()
			switch c.name {
			case "empty-claim":
				env = vgpuEnv("")
			case "unprepared":
				env = vgpuEnv(claimUnprepared)
			}
			req := createReq(pod, makeContainer(pod, c.name, env))
			resp, err := e.create(req)
			e.expectUntouched(t, req, resp, err, c.why)
		})
	}
	if _, err := os.Lstat(filepath.Join(e.root, "claims", claimUnprepared)); !os.IsNotExist(err) {
		t.Errorf("claims/%s exists (%v): nothing may be created for an unprepared claim", claimUnprepared, err)
	}
}

// TestRemoveContainer: RemoveContainer (StateChange REMOVE_CONTAINER before v0.12) removes the
// container's directory and nothing else.
func TestRemoveContainer(t *testing.T) {
	e := startSmall(t)
	pod := makePod("remove", 1, "")
	gone, kept := makeContainer(pod, "gone", vgpuEnv(claimA)), makeContainer(pod, "kept", vgpuEnv(claimA))
	for _, c := range []*api.Container{gone, kept} {
		resp, err := e.create(createReq(pod, c))
		e.expectInjected(t, createReq(pod, c), resp, err, claimA)
	}
	from := e.tr.numCalls()
	if err := removeContainer(context.Background(), e.a, pod, gone); err != nil {
		t.Fatalf("RemoveContainer: %v", err)
	}
	var rpcs []string
	for _, c := range e.tr.callsSince(from, "") {
		rpcs = append(rpcs, fmt.Sprintf("%s (%v)", c.method, c.code))
	}
	t.Logf("the runtime delivered the removal as: %s", strings.Join(rpcs, ", "))
	dir := e.containerDir(claimA, pod, "gone")
	e.waitFor("the plugin to remove "+dir, 5*time.Second, func(*tracker) bool {
		_, err := os.Lstat(dir)
		return os.IsNotExist(err)
	})
	e.expectDirs(t, e.containerDir(claimA, pod, "kept"))
	if _, err := os.Stat(filepath.Join(e.root, "claims", claimA)); err != nil {
		t.Errorf("the claim directory must stay (Unprepare removes it): %v", err)
	}
	// removals of containers the plugin never injected are no-ops, not errors
	for _, c := range []*api.Container{makeContainer(pod, "plain", plainEnv()), makeContainer(pod, "foreign", vgpuEnv(claimUnprepared))} {
		if err := removeContainer(context.Background(), e.a, pod, c); err != nil {
			t.Errorf("RemoveContainer of %s: %v", c.Name, err)
		}
	}
}

// TestPodSandboxEvents: StopPodSandbox removes the directories of the pod's containers (DESIGN.md
// §5), RemovePodSandbox too; other pods keep theirs.
func TestPodSandboxEvents(t *testing.T) {
	e := startSmall(t)
	p1, p2 := makePod("sandbox", 1, ""), makePod("sandbox", 2, "")
	ctrs := map[*api.PodSandbox][]string{p1: {"one", "two"}, p2: {"three"}}
	for pod, names := range ctrs {
		for _, n := range names {
			req := createReq(pod, makeContainer(pod, n, vgpuEnv(claimA)))
			resp, err := e.create(req)
			e.expectInjected(t, req, resp, err, claimA)
		}
	}
	gone := func(pod *api.PodSandbox, event string) {
		for _, n := range ctrs[pod] {
			dir := e.containerDir(claimA, pod, n)
			e.waitFor(fmt.Sprintf("the plugin to remove %s after %s", dir, event), 5*time.Second, func(*tracker) bool {
				_, err := os.Lstat(dir)
				return os.IsNotExist(err)
			})
		}
	}
	if err := stopPodSandbox(context.Background(), e.a, p1); err != nil {
		t.Fatalf("StopPodSandbox: %v", err)
	}
	gone(p1, "StopPodSandbox")
	e.expectDirs(t, e.containerDir(claimA, p2, "three"))
	if err := removePodSandbox(context.Background(), e.a, p2); err != nil {
		t.Fatalf("RemovePodSandbox: %v", err)
	}
	gone(p2, "RemovePodSandbox")
}

// TestPluginErrorFailsCreateContainer: a directory that cannot be made (the claim dir is a regular
// file) is a plugin error; the runtime fails CreateContainer with the plugin's message and keeps
// the plugin connected.
func TestPluginErrorFailsCreateContainer(t *testing.T) {
	e := startSmall(t)
	claimDir := filepath.Join(e.root, "claims", claimBroken)
	if err := os.MkdirAll(filepath.Dir(claimDir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(claimDir, []byte("not a directory\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pod := makePod("broken", 1, "")
	resp, err := e.create(createReq(pod, makeContainer(pod, "app", vgpuEnv(claimBroken))))
	if err == nil {
		t.Fatalf("CreateContainer with claims/%s a regular file: want an error (fail-closed), got success: %v", claimBroken, resp)
	}
	t.Logf("the runtime failed CreateContainer: %v", err)
	if !strings.Contains(err.Error(), claimBroken) {
		t.Errorf("the error must carry the plugin's message naming the directory (with claim UID %s): %v", claimBroken, err)
	}
	var closed, connected int
	e.tr.get(func(tr *tracker) { closed, connected = tr.closed, tr.connected })
	req := createReq(pod, makeContainer(pod, "healthy", vgpuEnv(claimA)))
	resp, err = e.create(req)
	e.expectInjected(t, req, resp, err, claimA)
	e.tr.get(func(tr *tracker) {
		if tr.closed != closed || tr.connected != connected || len(tr.dropped) != 0 {
			t.Errorf("an error answer must not cost the connection: closes %d -> %d, connections %d -> %d, drops %q",
				closed, tr.closed, connected, tr.connected, tr.dropped)
		}
	})
}

// TestSlowPluginDroppedAndReconnects: a CreateContainer slower than the runtime's request timeout
// makes the runtime drop the plugin and create the container without its adjustment; the plugin
// reconnects (full handshake and Synchronize) and the next container is injected. The slow
// handler's late answer must not disturb the new session.
func TestSlowPluginDroppedAndReconnects(t *testing.T) {
	e := startSmall(t)
	const timeout = 200 * time.Millisecond
	adaptation.SetPluginRequestTimeout(timeout)
	defer adaptation.SetPluginRequestTimeout(defaultRequestTimeout)

	var connected0, syncs0 int
	e.tr.get(func(tr *tracker) { connected0, syncs0 = tr.connected, len(tr.syncs) })
	pod := makePod("slow", 1, "")
	req := createReq(pod, makeContainer(pod, slowContainer, vgpuEnv(claimA)))
	began := time.Now()
	resp, err := e.create(req)
	took := time.Since(began)
	adaptation.SetPluginRequestTimeout(defaultRequestTimeout)
	t.Logf("CreateContainer of %q (plugin delay 1 s, request timeout %s) returned after %s", slowContainer, timeout, took.Round(time.Millisecond))
	e.expectUntouched(t, req, resp, err, "the runtime dropped the slow plugin: creation goes on without it")
	if took > 900*time.Millisecond {
		t.Errorf("CreateContainer took %s: the runtime should have given up after %s", took, timeout)
	}
	e.waitFor("the runtime to drop the plugin", 2*time.Second, func(tr *tracker) bool { return len(tr.dropped) > 0 })
	e.waitConnected(connected0+1, 15*time.Second)
	e.tr.get(func(tr *tracker) {
		if len(tr.syncs) <= syncs0 {
			t.Errorf("no new Synchronize after the reconnection")
		}
	})
	pods, ctrs := smallState()
	e.expectSyncReport(2, syncReport{Pods: len(pods), Containers: len(ctrs), Tracked: 1})
	// let the dropped session's slow handler finish (1 s after it began) before checking again
	time.Sleep(time.Until(began.Add(1300 * time.Millisecond)))
	var closed, dropped int
	e.tr.get(func(tr *tracker) { closed, dropped = tr.closed, len(tr.dropped) })
	after := createReq(pod, makeContainer(pod, "after", vgpuEnv(claimA)))
	resp, err = e.create(after)
	e.expectInjected(t, after, resp, err, claimA)
	e.tr.get(func(tr *tracker) {
		if tr.closed != closed || len(tr.dropped) != dropped || tr.connected != connected0+1 {
			t.Errorf("the new session was disturbed: closes %d -> %d, drops %d -> %d, connections %d (want %d)",
				closed, tr.closed, dropped, len(tr.dropped), tr.connected, connected0+1)
		}
	})
}

// TestLargeAdjustment: replies whose ttrpc frame is just under, at and over 4096 bytes (the Go
// side reads each logical connection through a 4096-byte buffer; nri-protocol.md §0 trap 1), and
// much larger, carry exactly the injected env. The pod name, echoed in VGPU_POD_NAME, sets the size
// (the runtime does not validate it; Kubernetes would).
func TestLargeAdjustment(t *testing.T) {
	e := startSmall(t)
	cases := []struct {
		name  string
		frame int // wanted ttrpc frame size of the reply: 10-byte header + ttrpc Response
		utf8  bool
	}{
		{"frame 4095", 4095, false},
		{"frame 4096", 4096, false},
		{"frame 4097", 4097, false},
		{"frame 4107", 4107, false},
		{"frame 8193", 8193, false},
		{"frame 64 KiB", 64 << 10, false},
		{"frame 1 MiB", 1 << 20, false},
		{"multi-byte UTF-8, frame 6000", 6000, true},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var req *api.CreateContainerRequest
			var frame int
			ctr := fmt.Sprintf("big-%d", i)
			for n := 1; ; n++ {
				pod := makePod("large", i, podName(n, c.utf8))
				req = createReq(pod, makeContainer(pod, ctr, vgpuEnv(claimA)))
				frame = replyFrame(proto.Size(&api.CreateContainerResponse{Adjust: &api.ContainerAdjustment{
					Mounts: wantMounts(e.containerDir(claimA, pod, ctr)), Env: wantEnv(pod, ctr)}}))
				if frame >= c.frame {
					break
				}
				if n == 1 && c.frame-frame > 64 {
					n += c.frame - frame - 64
				}
			}
			from := e.tr.numCalls()
			resp, err := e.create(req)
			e.expectInjected(t, req, resp, err, claimA)
			var got []callRecord
			got = e.tr.callsSince(from, "CreateContainer")
			if len(got) == 1 {
				t.Logf("pod name %d bytes: expected reply frame %d bytes; the plugin's reply payload was %d bytes (frame %d)",
					len(req.Pod.Name), frame, got[0].respBytes, replyFrame(got[0].respBytes))
			}
		})
	}
}

// podName is a name of exactly n bytes; with utf8, mostly 2-, 3- and 4-byte characters.
func podName(n int, utf8 bool) string {
	pattern := "pod-0123456789-abcdefghijklmnopqrstuvwxyz-"
	if utf8 {
		pattern = "pod-é€𝄞-ü"
	}
	var b strings.Builder
	for b.Len() < n {
		for _, r := range pattern {
			if b.Len()+len(string(r)) > n {
				break
			}
			b.WriteRune(r)
		}
		if b.Len() < n && b.Len()+4 > n { // pad with ASCII when no character fits exactly
			b.WriteString(strings.Repeat("x", n-b.Len()))
		}
	}
	return b.String()
}
