//go:build !nri061

// Command sideplugin is an NRI plugin for the node e2e (tests/e2e/test_node_coexistence.py,
// tests/e2e/nriplugins.py), registered beside vgpud and containerd/nri's sample ulimit-adjuster on the
// same runtime. It does what the sample cannot show: it reports what the runtime sent it, and it sets
// environment variables, so that it can collide with vgpud's:
//
//	side-adjuster.vgpud.test/env: "K=V[,K=V...]"  these variables, every container of the pod
//
// A pod without the annotation is left alone; a bad one fails the container's creation with a message
// that names it. With --report PATH it appends one JSON line per CreateContainer with the env keys,
// mount destinations and rlimits of the container as it stood when this plugin was called (NRI applies
// each plugin's adjustment to the request before it calls the plugin with the next index) and the
// wall-clock time it was called.
//
// It is built from go.mod (the newest NRI) only and subscribes to CreateContainer alone, an event
// every runtime since NRI v0.3 knows, so it registers with containerd 1.7 (NRI v0.6.1) too. When the
// runtime closes the connection it exits with status 1; on SIGTERM with status 0.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

const annotationEnv = "side-adjuster.vgpud.test/env"

type plugin struct {
	report string
	mu     sync.Mutex
}

func main() {
	var socket, idx, name, report string
	flag.StringVar(&socket, "socket", "", "the runtime's NRI socket (required)")
	flag.StringVar(&idx, "idx", "20", "NRI plugin index")
	flag.StringVar(&name, "name", "side-adjuster", "NRI plugin name")
	flag.StringVar(&report, "report", "", "append one JSON line per CreateContainer")
	flag.Parse()
	log.SetPrefix("sideplugin: ")
	log.SetFlags(log.Lmicroseconds)
	if socket == "" {
		log.Fatal("--socket is required")
	}
	p := &plugin{report: report}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	s, err := stub.New(p, stub.WithSocketPath(socket), stub.WithPluginName(name), stub.WithPluginIdx(idx))
	if err != nil {
		log.Fatalf("stub: %v", err)
	}
	err = s.Run(ctx)
	if ctx.Err() != nil {
		log.Printf("stopped")
		return
	}
	log.Fatalf("the runtime closed the connection: %v", err)
}

// CreateContainer applies the pod's annotation and reports what it saw and did.
func (p *plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	called := now()
	adjust, applied, err := adjustment(pod.GetAnnotations())
	entry := map[string]any{
		"event":     "CreateContainer",
		"time":      called,
		"pod_uid":   pod.GetUid(),
		"pod":       pod.GetNamespace() + "/" + pod.GetName(),
		"container": ctr.GetName(),
		"env_keys":  envKeys(ctr.GetEnv()),
		"mounts":    mountDestinations(ctr.GetMounts()),
		"rlimits":   rlimits(ctr.GetRlimits()),
		"adjusted":  applied,
	}
	if err != nil {
		entry["error"] = err.Error()
	}
	p.write(entry)
	if err != nil {
		return nil, nil, err
	}
	return adjust, nil, nil
}

// adjustment is what the annotation asks for (nil when it asks for nothing) and a summary of it.
func adjustment(annotations map[string]string) (*api.ContainerAdjustment, map[string]string, error) {
	value, ok := annotations[annotationEnv]
	if !ok {
		return nil, nil, nil
	}
	adjust := &api.ContainerAdjustment{}
	env := map[string]string{}
	for _, pair := range strings.Split(value, ",") {
		key, val, found := strings.Cut(pair, "=")
		if !found || key == "" {
			return nil, nil, fmt.Errorf("annotation %s=%q: want K=V[,K=V...]", annotationEnv, value)
		}
		adjust.AddEnv(key, val)
		env[key] = val
	}
	return adjust, env, nil
}

func envKeys(env []string) []string {
	keys := make([]string, 0, len(env))
	for _, e := range env {
		key, _, _ := strings.Cut(e, "=")
		keys = append(keys, key)
	}
	slices.Sort(keys)
	return keys
}

func mountDestinations(mounts []*api.Mount) []string {
	out := make([]string, 0, len(mounts))
	for _, m := range mounts {
		out = append(out, m.GetDestination())
	}
	return out
}

// rlimits as {type, soft, hard}, in the order the runtime sent them.
func rlimits(limits []*api.POSIXRlimit) []map[string]any {
	out := make([]map[string]any, 0, len(limits))
	for _, l := range limits {
		out = append(out, map[string]any{"type": l.GetType(), "soft": l.GetSoft(), "hard": l.GetHard()})
	}
	return out
}

func now() float64 {
	return float64(time.Now().UnixNano()) / 1e9
}

func (p *plugin) write(entry map[string]any) {
	if p.report == "" {
		return
	}
	line, err := json.Marshal(entry)
	if err == nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		err = appendLine(p.report, line)
	}
	if err != nil {
		log.Printf("report: %v", err)
	}
}

func appendLine(path string, line []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, werr := f.Write(append(line, '\n'))
	return errors.Join(werr, f.Close())
}
