package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
)

const benchSyncContainers = 10000

type latency struct {
	p50, p99, mean time.Duration
	perSec         float64
	failed         int
}

type benchResult struct {
	label       string
	syncTime    time.Duration // the runtime's Synchronize call(s), first byte out -> last answer in
	syncChunks  int
	syncBytes   int
	startToSync time.Duration // process start -> registered, configured, synchronized, added
	create      map[int]latency
}

// TestBench measures, in one run and against the same runtime code, the plugin under test
// ($VGPUD_NRI_PLUGIN_CMD) and the Go stub plugin doing the same injection ($VGPUD_NRI_GOPLUGIN_CMD):
// CreateContainer round trip at concurrency 1 and 32, and the time to synchronize 10,000 containers.
// Figures only, no assertions on them; the request timeout is raised to 60 s so that a slow
// Synchronize is measured rather than dropped (the table says when it exceeds the 2 s default).
func TestBench(t *testing.T) {
	if !*benchMode {
		t.Skip("bench mode not requested: run with -vgpud.bench (bench/nri_latency.py does)")
	}
	adaptation.SetPluginRequestTimeout(60 * time.Second)
	defer adaptation.SetPluginRequestTimeout(defaultRequestTimeout)
	plugins := []struct{ label, variable string }{
		{*benchLabel, "VGPUD_NRI_PLUGIN_CMD"},
		{"Go stub plugin", "VGPUD_NRI_GOPLUGIN_CMD"},
	}
	var results []benchResult
	for _, p := range plugins {
		var res benchResult
		t.Run(strings.ReplaceAll(p.label, " ", "_"), func(t *testing.T) { res = benchOne(t, p.label, p.variable) })
		if t.Failed() {
			return
		}
		results = append(results, res)
	}
	printBench(results)
	if *benchJSON != "" {
		if err := writeBenchJSON(*benchJSON, results); err != nil {
			t.Fatalf("writing %s: %v", *benchJSON, err)
		}
	}
}

func benchOne(t *testing.T, label, variable string) benchResult {
	pods, ctrs, _ := syncState(benchSyncContainers, 5)
	e := newEnv(t, envOptions{pods: pods, ctrs: ctrs, cmdVar: variable})
	e.waitConnected(1, 120*time.Second)
	res := benchResult{label: label, create: map[int]latency{}, syncBytes: syncSize(pods, ctrs)}
	e.tr.get(func(tr *tracker) {
		res.syncTime, res.syncChunks = tr.syncs[0].dur, len(tr.syncs[0].chunks)
		res.startToSync = tr.connectedAt[0].Sub(e.plugin.started)
	})
	pod := makePod("bench", 0, "")
	var seq atomic.Int64
	call := func() (time.Duration, bool) {
		i := seq.Add(1)
		req := createReq(pod, makeContainer(pod, fmt.Sprintf("c%d", i), vgpuEnv(claimA)))
		began := time.Now()
		resp, err := e.a.CreateContainer(context.Background(), req)
		took := time.Since(began)
		return took, err == nil && resp != nil && resp.Adjust != nil && len(resp.Adjust.Mounts) == 5
	}
	for i := 0; i < 100; i++ { // warm-up
		call()
	}
	for _, conc := range []int{1, 32} {
		lat := make([]time.Duration, *benchCalls)
		var next, failed atomic.Int64
		var wg sync.WaitGroup
		began := time.Now()
		for w := 0; w < conc; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1) - 1
					if i >= int64(len(lat)) {
						return
					}
					d, ok := call()
					lat[i] = d
					if !ok {
						failed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		wall := time.Since(began)
		res.create[conc] = summarize(lat, wall, int(failed.Load()))
		if failed.Load() > 0 {
			t.Errorf("%s: %d of %d CreateContainer calls at concurrency %d failed or were not injected\n%s",
				label, failed.Load(), len(lat), conc, e.tr.diagnostics())
		}
	}
	return res
}

func summarize(lat []time.Duration, wall time.Duration, failed int) latency {
	sorted := append([]time.Duration(nil), lat...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	pct := func(p float64) time.Duration { return sorted[int(p/100*float64(len(sorted)-1)+0.5)] }
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	return latency{p50: pct(50), p99: pct(99), mean: sum / time.Duration(len(lat)),
		perSec: float64(len(lat)) / wall.Seconds(), failed: failed}
}

func printBench(rs []benchResult) {
	if len(rs) != 2 {
		return
	}
	a, b := rs[0], rs[1]
	ms := func(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/float64(time.Millisecond)) }
	ratio := func(x, y float64) string {
		if y == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2fx", x/y)
	}
	w := os.Stdout
	fmt.Fprintf(w, "\nNRI bench: runtime = github.com/containerd/nri %s adaptation (in process), %d CreateContainer calls per row\n",
		moduleVersion("github.com/containerd/nri"), *benchCalls)
	fmt.Fprintf(w, "(the runtime serializes CreateContainer: at concurrency 32 a call's time includes its wait for the others)\n\n")
	fmt.Fprintf(w, "%-34s %18s %18s %9s\n", "", a.label, b.label, "ratio")
	for _, conc := range []int{1, 32} {
		la, lb := a.create[conc], b.create[conc]
		fmt.Fprintf(w, "%-34s %18s %18s %9s\n", fmt.Sprintf("CreateContainer c=%d  p50", conc), ms(la.p50), ms(lb.p50), ratio(float64(la.p50), float64(lb.p50)))
		fmt.Fprintf(w, "%-34s %18s %18s %9s\n", fmt.Sprintf("CreateContainer c=%d  p99", conc), ms(la.p99), ms(lb.p99), ratio(float64(la.p99), float64(lb.p99)))
		fmt.Fprintf(w, "%-34s %18s %18s %9s\n", fmt.Sprintf("CreateContainer c=%d  calls/s", conc),
			fmt.Sprintf("%.0f", la.perSec), fmt.Sprintf("%.0f", lb.perSec), ratio(lb.perSec, la.perSec))
	}
	fmt.Fprintf(w, "%-34s %18s %18s %9s\n", fmt.Sprintf("Synchronize %d containers", benchSyncContainers),
		ms(a.syncTime), ms(b.syncTime), ratio(float64(a.syncTime), float64(b.syncTime)))
	fmt.Fprintf(w, "%-34s %18s %18s %9s\n", "process start -> synchronized", ms(a.startToSync), ms(b.startToSync),
		ratio(float64(a.startToSync), float64(b.startToSync)))
	fmt.Fprintf(w, "\nSynchronize: %.2f MiB in %d chunk(s) (%s: %d); ratio = first / second (calls/s: second / first)\n",
		float64(a.syncBytes)/(1<<20), a.syncChunks, b.label, b.syncChunks)
	for _, r := range rs {
		if r.syncTime > defaultRequestTimeout {
			fmt.Fprintf(w, "NOTE: %s took %s to synchronize: over containerd's default %s request timeout, "+
				"the runtime would drop it\n", r.label, ms(r.syncTime), defaultRequestTimeout)
		}
	}
}

// writeBenchJSON writes each plugin's figures in milliseconds, the plugin under test first, for
// bench/nri_latency.py to turn into `make bench` summary lines.
func writeBenchJSON(path string, rs []benchResult) error {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	type row map[string]any
	out := []row{}
	for _, r := range rs {
		entry := row{"label": r.label, "sync_ms": ms(r.syncTime), "start_to_sync_ms": ms(r.startToSync)}
		for conc, l := range r.create {
			entry[fmt.Sprintf("create_c%d", conc)] = row{"p50_ms": ms(l.p50), "p99_ms": ms(l.p99), "per_s": l.perSec}
		}
		out = append(out, entry)
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}
