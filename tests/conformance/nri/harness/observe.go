package main

// TestObserve drives `vgpud run` (not the plugin under test: the pytest module passes a command that
// starts the daemon) step by step with tests/conformance/test_observe_nri_go.py, which looks at the
// daemon's debug endpoints, metrics and `vgpud debug tail` between the steps. The two sides meet in
// the directory given with -vgpud.observe-dir: at each step the harness writes <step>.json and waits
// for the test's <step>.ack (JSON too).
//
//	connected  vgpud registered and synchronized (one pod, one plain container). The ack carries the
//	           UID of a claim the test has prepared through vgpud's DRA socket: {"claim": UID}.
//	created    CreateContainer main (the claim: injected), sidecar (no claim: untouched), forged
//	           (an unprepared claim: untouched), second (the claim: injected), then RemoveContainer
//	           second.
//	restarted  vgpud stopped (SIGTERM, exit 0) and started again with the runtime holding plain,
//	           main (with the mounts and env vgpud gave it), sidecar and forged: its Synchronize
//	           rebuilds the cache (main only).
//
// Skipped without -vgpud.observe-dir.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
)

var observeDir = flag.String("vgpud.observe-dir", "", "TestObserve: meet tests/conformance/test_observe_nri_go.py in DIR")

// stepTimeout bounds the test's work between two steps (it starts processes and polls endpoints).
const stepTimeout = 120 * time.Second

func TestObserve(t *testing.T) {
	if *observeDir == "" {
		t.Skip("driven by tests/conformance/test_observe_nri_go.py (-vgpud.observe-dir)")
	}
	pod := makePod("observe", 1, "")
	plain := makeContainer(pod, "plain", plainEnv())
	e := newEnv(t, envOptions{pods: []*api.PodSandbox{pod}, ctrs: []*api.Container{plain}})
	e.waitConnected(1, connectTimeout)

	var ack struct{ Claim string }
	observeStep(t, "connected", map[string]string{"pod_uid": pod.Uid, "namespace": pod.Namespace}, &ack)
	if ack.Claim == "" {
		t.Fatalf("connected.ack names no claim")
	}

	main := makeContainer(pod, "main", vgpuEnv(ack.Claim))
	sidecar := makeContainer(pod, "sidecar", plainEnv())
	forged := makeContainer(pod, "forged", vgpuEnv(claimUnprepared))
	second := makeContainer(pod, "second", vgpuEnv(ack.Claim))
	created := main // main as the runtime keeps it, with vgpud's adjustment
	for _, c := range []struct {
		ctr    *api.Container
		inject bool
	}{{main, true}, {sidecar, false}, {forged, false}, {second, true}} {
		req := createReq(pod, c.ctr)
		resp, err := e.create(req)
		if c.inject {
			e.expectInjected(t, req, resp, err, ack.Claim)
			if c.ctr == main {
				created = adjusted(main, resp.GetAdjust())
			}
		} else {
			e.expectUntouched(t, req, resp, err, "not a prepared claim")
		}
	}
	if err := removeContainer(context.Background(), e.a, pod, second); err != nil {
		t.Fatalf("RemoveContainer second: %v", err)
	}
	dir := e.containerDir(ack.Claim, pod, "second")
	e.waitFor("vgpud to remove "+dir, 5*time.Second, func(*tracker) bool {
		_, err := os.Lstat(dir)
		return os.IsNotExist(err)
	})
	observeStep(t, "created", map[string]string{"pod_uid": pod.Uid}, nil)

	if err := e.plugin.stop(); err != nil {
		t.Fatalf("stopping vgpud: %v", err)
	}
	e.setState([]*api.PodSandbox{pod}, []*api.Container{plain, created, sidecar, forged})
	e.startPlugin(pluginCommand(t, "VGPUD_NRI_PLUGIN_CMD"))
	e.waitConnected(2, connectTimeout)
	observeStep(t, "restarted", map[string]string{"pod_uid": pod.Uid}, nil)
}

// observeStep writes <name>.json and waits for <name>.ack, decoded into ack (when not nil).
func observeStep(t *testing.T, name string, info interface{}, ack interface{}) {
	t.Helper()
	data, err := json.Marshal(info)
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(*observeDir, name+".json.tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(*observeDir, name+".json")); err != nil {
		t.Fatal(err)
	}
	t.Logf("step %s: waiting for the test's %s.ack", name, name)
	deadline := time.Now().Add(stepTimeout)
	for {
		raw, err := os.ReadFile(filepath.Join(*observeDir, name+".ack"))
		if err == nil {
			if ack != nil {
				if err := json.Unmarshal(raw, ack); err != nil {
					t.Fatalf("%s.ack: %v", name, err)
				}
			}
			return
		}
		if !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s.ack within %s", name, stepTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
