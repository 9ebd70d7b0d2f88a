//go:build !nri061

package main

// What differs at the newest NRI (v0.12.x): dedicated lifecycle RPCs (RemoveContainer,
// StopPodSandbox, ... with a StateChange fallback when the plugin answers UNIMPLEMENTED), split
// Synchronize (v0.7+), timeouts and NRI version in Configure, NRI version in RegisterPlugin, and
// the runtime's plugin count through WithMetrics.

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
)

const (
	nriVariant = "newest NRI, go.mod"
	// runtimeVersion is what the runtime tells the plugin in Configure (runtime_version).
	runtimeVersion = "v2.3.0-conformance"
	// splitSync: the runtime splits a Synchronize over 4 MiB into chunks (more=true).
	splitSync = true
	// havePluginCount: the runtime reports its number of active plugins (WithMetrics).
	havePluginCount = true
)

func removeContainer(ctx context.Context, a *adaptation.Adaptation, pod *api.PodSandbox, ctr *api.Container) error {
	return a.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: pod, Container: ctr})
}

func postStartContainer(ctx context.Context, a *adaptation.Adaptation, pod *api.PodSandbox, ctr *api.Container) error {
	return a.PostStartContainer(ctx, &api.PostStartContainerRequest{Pod: pod, Container: ctr})
}

func stopPodSandbox(ctx context.Context, a *adaptation.Adaptation, pod *api.PodSandbox) error {
	return a.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: pod})
}

func removePodSandbox(ctx context.Context, a *adaptation.Adaptation, pod *api.PodSandbox) error {
	return a.RemovePodSandbox(ctx, &api.RemovePodSandboxRequest{Pod: pod})
}

func registerDetail(req *api.RegisterPluginRequest) string {
	return "plugin NRI version " + quoteOrNone(req.NRIVersion)
}

func configureDetail(req *api.ConfigureRequest) string {
	return fmt.Sprintf("runtime %s %s, NRI %s, registration timeout %d ms, request timeout %d ms",
		req.RuntimeName, req.RuntimeVersion, quoteOrNone(req.NRIVersion), req.RegistrationTimeout, req.RequestTimeout)
}

func quoteOrNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func metricsOptions(tr *tracker) []adaptation.Option {
	return []adaptation.Option{adaptation.WithMetrics(&metrics{tr})}
}

type metrics struct{ tr *tracker }

func (m *metrics) RecordPluginInvocation(string, string, error)                               {}
func (m *metrics) RecordPluginLatency(string, string, time.Duration)                          {}
func (m *metrics) RecordPluginAdjustments(string, string, *api.ContainerAdjustment, int, int) {}
func (m *metrics) UpdatePluginCount(n int)                                                    { m.tr.setPluginCount(n) }
