//go:build !nri061

// Command goplugin is the reference implementation of the plugin-under-test contract in
// ../README.md, built on the NRI Go stub (github.com/containerd/nri/pkg/stub). It does what
// vgpud's NRI plugin does for a vGPU container (directories, mounts, env, cleanup), with the same
// command line as plugin_under_test.py. Two uses:
//
//   - a known-good peer for the harness itself: a harness failure against this plugin is a harness
//     (or runtime) problem, not a vgpud one;
//   - the Go side of bench/nri_latency.py: the same injection, done by NRI's own Go code.
//
// With --control it also answers the harness's hot-plug requests (../README.md, "Control"): an
// unsolicited UpdateContainers of a container's device rules through the stub, and its map of
// every container (running, pid, cgroups path) kept from the lifecycle events.
//
// It is built from go.mod (the newest NRI) only; the v0.12 stub answers both the dedicated
// lifecycle RPCs and StateChange, and subscribes only to events that every runtime since v0.3
// knows, so it works against the v0.6.1 harness too.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

const (
	envClaimUID = "MANAGER_VGPU_CLAIM_UID"
	// healthySession resets the reconnect backoff, as vgpud's supervisor does.
	healthySession = 30 * time.Second
)

var (
	safeToken = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)
	dnsLabel  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
)

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

type plugin struct {
	root       string
	prepared   map[string]bool
	delays     map[string]time.Duration
	syncReport string

	mu sync.Mutex
	// pod UID -> container name -> the container's directory
	cache map[string]map[string]string
	// container ID -> what the runtime last reported of it (every container)
	targets map[string]target
	// the connected session's stub (nil between sessions)
	stub stub.Stub
}

type target struct {
	ContainerID string `json:"container_id"`
	PodUID      string `json:"pod_uid"`
	Container   string `json:"container"`
	Running     bool   `json:"running"`
	Pid         uint32 `json:"pid"`
	CgroupsPath string `json:"cgroups_path"`
}

func makeTarget(pod *api.PodSandbox, ctr *api.Container, running bool, pid uint32) target {
	return target{ctr.GetId(), pod.GetUid(), ctr.GetName(), running, pid, ctr.GetLinux().GetCgroupsPath()}
}

func main() {
	var (
		socket, root, idx, name, syncReport, control string
		backoff                                      float64
		prepared, delays                             multiFlag
	)
	flag.StringVar(&socket, "socket", "", "the runtime's NRI socket (required)")
	flag.StringVar(&root, "manager-root", "", "where claim directories go (required)")
	flag.StringVar(&idx, "idx", "00", "NRI plugin index")
	flag.StringVar(&name, "name", "manager.nvidia.com", "NRI plugin name")
	flag.Var(&prepared, "prepared-claim", "a prepared vGPU claim UID (repeatable)")
	flag.Float64Var(&backoff, "backoff", 0.1, "first reconnect delay, seconds")
	flag.Var(&delays, "delay-container", "NAME=SECONDS: CreateContainer of this container sleeps first")
	flag.StringVar(&syncReport, "sync-report", "", "append one JSON line per completed Synchronize")
	flag.StringVar(&control, "control", "", "serve the harness's hot-plug requests on this unix socket")
	flag.Parse()
	log.SetPrefix("goplugin: ")
	log.SetFlags(log.Lmicroseconds)
	if socket == "" || root == "" {
		log.Fatal("--socket and --manager-root are required")
	}
	absRoot, err := filepath.Abs(root)
	if err != nil {
		log.Fatal(err)
	}
	p := &plugin{
		root:       absRoot,
		prepared:   map[string]bool{},
		delays:     map[string]time.Duration{},
		syncReport: syncReport,
		cache:      map[string]map[string]string{},
		targets:    map[string]target{},
	}
	for _, uid := range prepared {
		p.prepared[uid] = true
	}
	for _, d := range delays {
		ctr, secs, ok := strings.Cut(d, "=")
		f, err := strconv.ParseFloat(secs, 64)
		if !ok || err != nil {
			log.Fatalf("--delay-container %q: want NAME=SECONDS", d)
		}
		p.delays[ctr] = time.Duration(f * float64(time.Second))
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if control != "" {
		l, err := net.Listen("unix", control)
		if err != nil {
			log.Fatalf("--control: %v", err)
		}
		defer l.Close()
		go p.serveControl(l)
	}
	initial := time.Duration(backoff * float64(time.Second))
	maxDelay := max(initial, 2*time.Second)
	delay := initial
	for ctx.Err() == nil {
		s, err := stub.New(p, stub.WithSocketPath(socket), stub.WithPluginName(name),
			stub.WithPluginIdx(idx), stub.WithOnClose(func() { log.Printf("connection closed") }))
		if err != nil {
			log.Fatalf("stub: %v", err)
		}
		began := time.Now()
		p.setStub(s)
		err = s.Run(ctx)
		p.setStub(nil)
		if ctx.Err() != nil {
			break
		}
		if time.Since(began) >= healthySession {
			delay = initial
		}
		log.Printf("session ended after %s (%v); reconnecting in %s", time.Since(began).Round(time.Millisecond), err, delay)
		select {
		case <-time.After(delay):
		case <-ctx.Done():
		}
		delay = min(2*delay, maxDelay)
	}
	log.Printf("stopped")
}

func envValue(env []string, key string) string {
	value := ""
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, key+"="); ok {
			value = v
		}
	}
	return value
}

// containerDir is <root>/claims/<claimUID>/<podUID>_<container>, or an error for unsafe names.
func (p *plugin) containerDir(claimUID, podUID, ctr string) (string, error) {
	if !safeToken.MatchString(claimUID) || claimUID == "." || claimUID == ".." {
		return "", fmt.Errorf("claim UID %q is not a safe path component", claimUID)
	}
	if !safeToken.MatchString(podUID) || podUID == "." || podUID == ".." {
		return "", fmt.Errorf("pod UID %q is not a safe path component", podUID)
	}
	if !dnsLabel.MatchString(ctr) {
		return "", fmt.Errorf("container name %q is not a DNS label", ctr)
	}
	return filepath.Join(p.root, "claims", claimUID, podUID+"_"+ctr), nil
}

// Synchronize rebuilds the cache from the containers' env (the stub joins split requests).
func (p *plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	podUID := map[string]string{}
	for _, pod := range pods {
		podUID[pod.GetId()] = pod.GetUid()
	}
	cache := map[string]map[string]string{}
	targets := map[string]target{}
	tracked := 0
	for _, c := range ctrs {
		if uid, ok := podUID[c.GetPodSandboxId()]; ok {
			live := c.GetState() == api.ContainerState_CONTAINER_RUNNING || c.GetState() == api.ContainerState_CONTAINER_PAUSED
			targets[c.GetId()] = target{c.GetId(), uid, c.GetName(), live, c.GetPid(), c.GetLinux().GetCgroupsPath()}
		}
		claim := envValue(c.GetEnv(), envClaimUID)
		uid, ok := podUID[c.GetPodSandboxId()]
		if claim == "" || !ok || !p.prepared[claim] {
			continue
		}
		dir, err := p.containerDir(claim, uid, c.GetName())
		if err != nil {
			log.Printf("Synchronize: container %s not cached: %v", c.GetId(), err)
			continue
		}
		if cache[uid] == nil {
			cache[uid] = map[string]string{}
		}
		cache[uid][c.GetName()] = dir
		tracked++
	}
	p.mu.Lock()
	p.cache = cache
	p.targets = targets
	p.mu.Unlock()
	log.Printf("synchronized: %d pods, %d containers, %d tracked", len(pods), len(ctrs), tracked)
	if p.syncReport != "" {
		line, _ := json.Marshal(map[string]int{"pods": len(pods), "containers": len(ctrs), "tracked": tracked})
		f, err := os.OpenFile(p.syncReport, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if _, err := f.Write(append(line, '\n')); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

func (p *plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	if d, ok := p.delays[ctr.GetName()]; ok {
		time.Sleep(d) // deliberately deaf to cancellation: a plugin that is simply slow
	}
	p.setTarget(makeTarget(pod, ctr, false, 0))
	claim := envValue(ctr.GetEnv(), envClaimUID)
	if claim == "" || !p.prepared[claim] {
		return nil, nil, nil
	}
	dir, err := p.containerDir(claim, pod.GetUid(), ctr.GetName())
	if err == nil {
		err = makeDirs(dir)
	}
	if err != nil {
		p.dropTarget(ctr.GetId())
		return nil, nil, fmt.Errorf("goplugin: cannot set up the vGPU directory of container %s in pod %s/%s: %w",
			ctr.GetName(), pod.GetNamespace(), pod.GetName(), err)
	}
	p.mu.Lock()
	if p.cache[pod.GetUid()] == nil {
		p.cache[pod.GetUid()] = map[string]string{}
	}
	p.cache[pod.GetUid()][ctr.GetName()] = dir
	p.mu.Unlock()

	bind := func(src, dst string, ro bool) *api.Mount {
		mode := "rw"
		if ro {
			mode = "ro"
		}
		return &api.Mount{Source: src, Destination: dst, Type: "bind", Options: []string{mode, "nosuid", "nodev", "bind"}}
	}
	adjust := &api.ContainerAdjustment{
		Mounts: []*api.Mount{
			bind(filepath.Join(dir, "config"), "/etc/vgpu-manager/config", false),
			bind(filepath.Join(dir, "vgpu_lock"), "/tmp/.vgpu_lock", false),
			bind(filepath.Join(dir, "vmem_node"), "/tmp/.vmem_node", false),
			bind(filepath.Join(dir, "sm_node"), "/tmp/.sm_node", false),
			bind(filepath.Join(dir, "config", "pids.config"), "/etc/vgpu-manager/config/pids.config", true),
		},
	}
	adjust.AddEnv("VGPU_POD_NAME", pod.GetName())
	adjust.AddEnv("VGPU_POD_NAMESPACE", pod.GetNamespace())
	adjust.AddEnv("VGPU_POD_UID", pod.GetUid())
	adjust.AddEnv("VGPU_CONTAINER_NAME", ctr.GetName())
	adjust.AddEnv("MANAGER_CLIENT_REGISTER_UUID", "")
	return adjust, nil, nil
}

// makeDirs creates the container's directories and an empty pids.config, truncated in place.
func makeDirs(dir string) error {
	for _, sub := range []string{"config", "vgpu_lock", "vmem_node", "sm_node"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(filepath.Join(dir, "config", "pids.config"), os.O_WRONLY|os.O_CREATE|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Truncate(0)
}

func (p *plugin) PostStartContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	p.setTarget(makeTarget(pod, ctr, true, ctr.GetPid()))
	return nil
}

func (p *plugin) StopContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) ([]*api.ContainerUpdate, error) {
	p.setTarget(makeTarget(pod, ctr, false, 0))
	return nil, nil
}

func (p *plugin) RemoveContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	p.dropTarget(ctr.GetId())
	p.mu.Lock()
	dir, ok := p.cache[pod.GetUid()][ctr.GetName()]
	delete(p.cache[pod.GetUid()], ctr.GetName())
	p.mu.Unlock()
	if !ok {
		claim := envValue(ctr.GetEnv(), envClaimUID)
		if claim == "" || !p.prepared[claim] {
			return nil
		}
		var err error
		if dir, err = p.containerDir(claim, pod.GetUid(), ctr.GetName()); err != nil {
			log.Printf("RemoveContainer: %v", err)
			return nil
		}
	}
	return removeDir(dir)
}

func (p *plugin) StopPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	return p.forgetPod(pod)
}

func (p *plugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	return p.forgetPod(pod)
}

func (p *plugin) forgetPod(pod *api.PodSandbox) error {
	p.mu.Lock()
	dirs := p.cache[pod.GetUid()]
	delete(p.cache, pod.GetUid())
	for id, t := range p.targets {
		if t.PodUID == pod.GetUid() {
			delete(p.targets, id)
		}
	}
	p.mu.Unlock()
	var errs []error
	for _, dir := range dirs {
		errs = append(errs, removeDir(dir))
	}
	return errors.Join(errs...)
}

func removeDir(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		log.Printf("removing %s: %v", dir, err)
		return err
	}
	return nil
}

func (p *plugin) setTarget(t target) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.targets[t.ContainerID] = t
}

func (p *plugin) dropTarget(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.targets, id)
}

func (p *plugin) setStub(s stub.Stub) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stub = s
}

type controlRequest struct {
	Op          string `json:"op"`
	ContainerID string `json:"container_id"`
	Rules       []struct {
		Allow  bool   `json:"allow"`
		Type   string `json:"type"`
		Major  *int64 `json:"major"`
		Minor  *int64 `json:"minor"`
		Access string `json:"access"`
	} `json:"rules"`
}

// serveControl answers one JSON request line per connection with one JSON reply line.
func (p *plugin) serveControl(l net.Listener) {
	for {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer conn.Close()
			var req controlRequest
			reply := map[string]interface{}{"error": ""}
			if err := json.NewDecoder(conn).Decode(&req); err != nil {
				reply["error"] = err.Error()
			} else {
				p.control(req, reply)
			}
			data, _ := json.Marshal(reply)
			_, _ = conn.Write(append(data, '\n'))
		}()
	}
}

func (p *plugin) control(req controlRequest, reply map[string]interface{}) {
	switch req.Op {
	case "target":
		p.mu.Lock()
		t, ok := p.targets[req.ContainerID]
		p.mu.Unlock()
		if ok {
			reply["target"] = t
		} else {
			reply["target"] = nil
		}
	case "update_devices":
		p.mu.Lock()
		s := p.stub
		p.mu.Unlock()
		if s == nil {
			reply["error"] = "not connected"
			return
		}
		var devices []*api.LinuxDeviceCgroup
		for _, r := range req.Rules {
			d := &api.LinuxDeviceCgroup{Allow: r.Allow, Type: r.Type, Access: r.Access}
			if r.Major != nil {
				d.Major = &api.OptionalInt64{Value: *r.Major}
			}
			if r.Minor != nil {
				d.Minor = &api.OptionalInt64{Value: *r.Minor}
			}
			devices = append(devices, d)
		}
		update := &api.ContainerUpdate{ContainerId: req.ContainerID,
			Linux: &api.LinuxContainerUpdate{Resources: &api.LinuxResources{Devices: devices}}}
		failed, err := s.UpdateContainers([]*api.ContainerUpdate{update})
		switch {
		case err != nil:
			reply["error"] = err.Error()
		case len(failed) > 0:
			var ids []string
			for _, f := range failed {
				ids = append(ids, f.GetContainerId())
			}
			reply["error"] = fmt.Sprintf("the runtime reports %s failed", strings.Join(ids, ", "))
		}
	default:
		reply["error"] = fmt.Sprintf("unknown op %q", req.Op)
	}
}
