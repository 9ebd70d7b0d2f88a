package main

// The hot-plug's NRI side (issue 18), through the plugin's control socket (README.md, "Control"):
//
//	TestUnsolicitedUpdate  the plugin's own UpdateContainers of one container's device cgroup rules
//	                       reaches the runtime's updateFn with exactly that container ID and those
//	                       rules; an error updateFn returns comes back to the caller with its text, a
//	                       failed list as a failure; none of it ends the plugin's connection.
//	TestTargets            the plugin's map of every container follows the runtime's events:
//	                       synchronized (not started), PostStartContainer (running, pid),
//	                       StopContainer (not running), RemoveContainer (gone).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"google.golang.org/protobuf/proto"
)

// controlTimeout bounds one control request (an update waits for the runtime's answer).
const controlTimeout = 10 * time.Second

func (e *env) controlPath() string { return filepath.Join(e.dir, "control.sock") }

// deviceRule is a rule as the control socket carries it (nil major/minor: any).
type deviceRule struct {
	Allow  bool   `json:"allow"`
	Type   string `json:"type"`
	Major  *int64 `json:"major"`
	Minor  *int64 `json:"minor"`
	Access string `json:"access"`
}

type controlTarget struct {
	ContainerID string `json:"container_id"`
	PodUID      string `json:"pod_uid"`
	Container   string `json:"container"`
	Running     bool   `json:"running"`
	Pid         uint32 `json:"pid"`
	CgroupsPath string `json:"cgroups_path"`
}

type controlReply struct {
	Error  string         `json:"error"`
	Target *controlTarget `json:"target"`
}

// control sends one request to the plugin's control socket and returns its reply.
func (e *env) control(req map[string]interface{}) controlReply {
	e.t.Helper()
	conn, err := net.DialTimeout("unix", e.controlPath(), controlTimeout)
	if err != nil {
		e.t.Fatalf("the plugin's control socket %s: %v", e.controlPath(), err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(controlTimeout))
	data, _ := json.Marshal(req)
	if _, err := conn.Write(append(data, '\n')); err != nil {
		e.t.Fatalf("control request %s: %v", data, err)
	}
	var reply controlReply
	if err := json.NewDecoder(conn).Decode(&reply); err != nil {
		e.t.Fatalf("control request %s: no reply: %v\n%s", data, err, e.plugin.out.lastLines())
	}
	return reply
}

func (e *env) updateDevices(id string, rules []deviceRule) controlReply {
	return e.control(map[string]interface{}{"op": "update_devices", "container_id": id, "rules": rules, "timeout": 5})
}

func (e *env) setUpdateReply(f func([]*api.ContainerUpdate) ([]*api.ContainerUpdate, error)) {
	e.stateMu.Lock()
	defer e.stateMu.Unlock()
	e.updateReply = f
}

func (e *env) receivedUpdates() [][]*api.ContainerUpdate {
	e.stateMu.Lock()
	defer e.stateMu.Unlock()
	return append([][]*api.ContainerUpdate{}, e.updates...)
}

func i64(v int64) *int64 { return &v }

func cloneContainer(c *api.Container) *api.Container { return proto.Clone(c).(*api.Container) }

func TestUnsolicitedUpdate(t *testing.T) {
	pods, ctrs := smallState()
	e := newEnv(t, envOptions{pods: pods, ctrs: ctrs, control: true})
	e.waitConnected(1, connectTimeout)
	target := ctrs[1] // a running container without a vGPU: any container may get one
	rules := []deviceRule{
		{Allow: true, Type: "c", Major: i64(195), Minor: i64(0), Access: "rw"},
		{Allow: true, Type: "c", Major: i64(195), Minor: i64(255), Access: "rw"},
		{Allow: true, Type: "c", Major: i64(508), Minor: nil, Access: "rwm"},
		{Allow: false, Type: "a", Major: nil, Minor: nil, Access: "m"},
	}

	t.Run("received as sent", func(t *testing.T) {
		if r := e.updateDevices(target.Id, rules); r.Error != "" {
			t.Fatalf("update_devices: %s", r.Error)
		}
		got := e.receivedUpdates()
		if len(got) != 1 || len(got[0]) != 1 {
			t.Fatalf("the runtime's updateFn got %d calls (%v), want exactly one of one container", len(got), got)
		}
		u := got[0][0]
		if u.ContainerId != target.Id || u.IgnoreFailure {
			t.Errorf("update of container %q (ignore_failure %v), want %q and false", u.ContainerId, u.IgnoreFailure, target.Id)
		}
		res := u.GetLinux().GetResources()
		if res.GetMemory() != nil || res.GetCpu() != nil || len(res.GetHugepageLimits()) != 0 || len(res.GetUnified()) != 0 {
			t.Errorf("the update changes more than device rules: %v", res)
		}
		if want, have := describeRules(rules), describeDevices(res.GetDevices()); want != have {
			t.Errorf("device rules the runtime got:\n  %s\nwant:\n  %s", have, want)
		}
	})

	t.Run("an updateFn error comes back with its text", func(t *testing.T) {
		const refusal = "conformance: container is being torn down, no device changes"
		e.setUpdateReply(func([]*api.ContainerUpdate) ([]*api.ContainerUpdate, error) {
			return nil, errors.New(refusal)
		})
		r := e.updateDevices(target.Id, rules)
		if !strings.Contains(r.Error, refusal) {
			t.Errorf("update_devices answered %q, want an error carrying %q", r.Error, refusal)
		}
	})

	t.Run("a failed list is a failure", func(t *testing.T) {
		e.setUpdateReply(func(u []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) { return u, nil })
		r := e.updateDevices(target.Id, rules)
		if !strings.Contains(r.Error, target.Id) || !strings.Contains(r.Error, "failed") {
			t.Errorf("update_devices answered %q, want a failure naming %s", r.Error, target.Id)
		}
	})

	e.setUpdateReply(nil)
	if n := len(e.receivedUpdates()); n != 3 {
		t.Errorf("the runtime's updateFn got %d calls, want 3", n)
	}
	e.tr.get(func(tr *tracker) {
		if tr.closed != 0 || len(tr.dropped) != 0 || tr.connected != 1 {
			t.Errorf("failed updates cost the connection: %d connections, %d closes, drops %q", tr.connected, tr.closed, tr.dropped)
		}
	})
	pod := makePod("after-update", 1, "")
	req := createReq(pod, makeContainer(pod, "app", vgpuEnv(claimA)))
	resp, err := e.create(req)
	e.expectInjected(t, req, resp, err, claimA)
}

func TestTargets(t *testing.T) {
	pods, ctrs := smallState()
	e := newEnv(t, envOptions{pods: pods, ctrs: ctrs, control: true})
	e.waitConnected(1, connectTimeout)
	pod, ctr := pods[0], ctrs[1] // a plain container: the map holds every container
	target := func() *controlTarget {
		return e.control(map[string]interface{}{"op": "target", "container_id": ctr.Id}).Target
	}
	expect := func(step string, running bool, pid uint32) {
		t.Helper()
		got := target()
		if got == nil {
			t.Fatalf("after %s the plugin does not know container %s", step, ctr.Id)
		}
		if got.PodUID != pod.Uid || got.Container != ctr.Name || got.CgroupsPath != ctr.GetLinux().GetCgroupsPath() {
			t.Errorf("after %s: %+v, want pod %s, container %s, cgroups path %q", step, *got, pod.Uid, ctr.Name, ctr.GetLinux().GetCgroupsPath())
		}
		if got.Running != running || got.Pid != pid {
			t.Errorf("after %s: running %v, pid %d; want %v, %d", step, got.Running, got.Pid, running, pid)
		}
	}
	expect("Synchronize (created, not started)", false, 0)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	started := cloneContainer(ctr)
	started.State, started.Pid = api.ContainerState_CONTAINER_RUNNING, 4321
	if err := postStartContainer(ctx, e.a, pod, started); err != nil {
		t.Fatalf("PostStartContainer: %v", err)
	}
	expect("PostStartContainer", true, 4321)

	stopped := cloneContainer(started)
	stopped.State = api.ContainerState_CONTAINER_STOPPED
	if _, err := e.a.StopContainer(ctx, &api.StopContainerRequest{Pod: pod, Container: stopped}); err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
	expect("StopContainer", false, 0)

	if err := removeContainer(ctx, e.a, pod, stopped); err != nil {
		t.Fatalf("RemoveContainer: %v", err)
	}
	if got := target(); got != nil {
		t.Errorf("after RemoveContainer the plugin still knows %+v", *got)
	}
	var rpcs []string
	for _, c := range e.tr.callsSince(0, "") {
		rpcs = append(rpcs, c.method)
	}
	t.Logf("the runtime called: %s", strings.Join(rpcs, ", "))
}

func describeRules(rules []deviceRule) string {
	var out []string
	for _, r := range rules {
		out = append(out, fmt.Sprintf("%v %s %s:%s %s", r.Allow, r.Type, num(r.Major), num(r.Minor), r.Access))
	}
	return strings.Join(out, "; ")
}

func describeDevices(devices []*api.LinuxDeviceCgroup) string {
	var out []string
	for _, d := range devices {
		var major, minor *int64
		if d.Major != nil {
			major = i64(d.Major.Value)
		}
		if d.Minor != nil {
			minor = i64(d.Minor.Value)
		}
		out = append(out, fmt.Sprintf("%v %s %s:%s %s", d.Allow, d.Type, num(major), num(minor), d.Access))
	}
	return strings.Join(out, "; ")
}

func num(v *int64) string {
	if v == nil {
		return "*"
	}
	return fmt.Sprint(*v)
}
