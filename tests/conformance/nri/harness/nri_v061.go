//go:build nri061

package main

// What differs at NRI v0.6.1 (containerd 1.7.16 - 1.7.25): lifecycle events other than
// Create/Update/StopContainer go through StateChange(StateChangeEvent); no split Synchronize (the
// whole state goes in one message, and ttrpc v1.2.5 sends one over 4 MiB anyway); ConfigureRequest
// has no timeouts and no NRI version; RegisterPluginRequest has no NRI version; no WithMetrics.

import (
	"context"
	"fmt"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
)

const (
	nriVariant      = "NRI v0.6.1 as containerd 1.7.24 ships it, nri061.mod"
	runtimeVersion  = "v1.7.24"
	splitSync       = false
	havePluginCount = false
)

func removeContainer(ctx context.Context, a *adaptation.Adaptation, pod *api.PodSandbox, ctr *api.Container) error {
	return a.RemoveContainer(ctx, &api.StateChangeEvent{Pod: pod, Container: ctr})
}

func postStartContainer(ctx context.Context, a *adaptation.Adaptation, pod *api.PodSandbox, ctr *api.Container) error {
	return a.PostStartContainer(ctx, &api.StateChangeEvent{Pod: pod, Container: ctr})
}

func stopPodSandbox(ctx context.Context, a *adaptation.Adaptation, pod *api.PodSandbox) error {
	return a.StopPodSandbox(ctx, &api.StateChangeEvent{Pod: pod})
}

func removePodSandbox(ctx context.Context, a *adaptation.Adaptation, pod *api.PodSandbox) error {
	return a.RemovePodSandbox(ctx, &api.StateChangeEvent{Pod: pod})
}

func registerDetail(*api.RegisterPluginRequest) string {
	return "(v0.6.1 RegisterPluginRequest has no NRI version)"
}

func configureDetail(req *api.ConfigureRequest) string {
	return fmt.Sprintf("runtime %s %s (v0.6.1 ConfigureRequest: no timeouts, no NRI version)", req.RuntimeName, req.RuntimeVersion)
}

func metricsOptions(*tracker) []adaptation.Option { return nil }
