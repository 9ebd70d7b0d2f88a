// Command harness drives an NRI plugin process with containerd's own runtime half of NRI
// (github.com/containerd/nri/pkg/adaptation): the code containerd embeds, at the NRI version this
// binary was built with (go.mod: the newest; nri061.mod + tag nri061: v0.6.1, as containerd 1.7.24).
//
// It is a Go test program run through testing.Main rather than a `go test -c` binary, because a
// test binary carries no module versions in its build info, and the runtime reads its own NRI
// version from there for the Configure request (a test binary would say "0.0.0-unknown", which
// no real containerd does). Flags are the usual -test.v, -test.run, -test.timeout, plus -vgpud.*.
//
// The plugin under test is started from the JSON array in $VGPUD_NRI_PLUGIN_CMD plus the
// arguments described in ../README.md. Every test starts its own runtime (socket under a short
// temp dir) and its own plugin process, and stops both (the plugin by PID: SIGTERM, then SIGKILL).
//
// Output: the runtime's NRI log lines ("[nri]") and the plugin's output ("[plugin]") stream to
// stderr as they happen; failures say what was expected, what came back and where to look.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"regexp"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	nrilog "github.com/containerd/nri/pkg/log"
)

const (
	pluginName = "manager.nvidia.com"
	pluginIdx  = "00"
	// defaultRequestTimeout is containerd's plugin_request_timeout default.
	defaultRequestTimeout = 2 * time.Second
	// connectTimeout bounds process start -> registered + configured + synchronized.
	connectTimeout = 30 * time.Second
)

var (
	benchMode  = flag.Bool("vgpud.bench", false, "run TestBench (CreateContainer latency and Synchronize time)")
	benchCalls = flag.Int("vgpud.bench-calls", 2000, "CreateContainer calls per concurrency level in TestBench")
	benchLabel = flag.String("vgpud.bench-label", "plugin under test", "TestBench's name for $VGPUD_NRI_PLUGIN_CMD")
	benchJSON  = flag.String("vgpud.bench-json", "", "TestBench also writes its figures here as JSON (bench/nri_latency.py reads it)")
	debugLog   = flag.Bool("vgpud.debug", false, "also print the runtime's NRI debug log lines")
)

// tests is every test of the harness, in the order they run. A new Test function goes here.
var tests = []testing.InternalTest{
	{Name: "TestRegisterAndConfigure", F: TestRegisterAndConfigure},
	{Name: "TestSynchronizeLarge", F: TestSynchronizeLarge},
	{Name: "TestOversizedSynchronize", F: TestOversizedSynchronize},
	{Name: "TestCreateContainer", F: TestCreateContainer},
	{Name: "TestRemoveContainer", F: TestRemoveContainer},
	{Name: "TestPodSandboxEvents", F: TestPodSandboxEvents},
	{Name: "TestPluginErrorFailsCreateContainer", F: TestPluginErrorFailsCreateContainer},
	{Name: "TestSlowPluginDroppedAndReconnects", F: TestSlowPluginDroppedAndReconnects},
	{Name: "TestLargeAdjustment", F: TestLargeAdjustment},
	{Name: "TestUnsolicitedUpdate", F: TestUnsolicitedUpdate},
	{Name: "TestTargets", F: TestTargets},
	{Name: "TestBench", F: TestBench},
	{Name: "TestObserve", F: TestObserve},
}

func main() {
	testing.Init()
	flag.Parse()
	nrilog.Set(&hookLogger{})
	fmt.Fprintf(os.Stderr, "NRI runtime side: github.com/containerd/nri %s, github.com/containerd/ttrpc %s (%s)\n",
		moduleVersion("github.com/containerd/nri"), moduleVersion("github.com/containerd/ttrpc"), nriVariant)
	testing.Main(regexp.MatchString, tests, nil, nil)
}

func moduleVersion(path string) string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == path {
				if dep.Replace != nil {
					return dep.Replace.Version
				}
				return dep.Version
			}
		}
	}
	return "(unknown)"
}

// pluginCommand is the plugin-under-test command line from the environment (a JSON array).
func pluginCommand(t testing.TB, variable string) []string {
	t.Helper()
	raw := os.Getenv(variable)
	if raw == "" {
		t.Fatalf("$%s is not set: it must hold the plugin command line as a JSON array, "+
			`e.g. [".venv/bin/python", "tests/conformance/nri/plugin_under_test.py"] (see README.md)`, variable)
	}
	var argv []string
	if err := json.Unmarshal([]byte(raw), &argv); err != nil || len(argv) == 0 {
		t.Fatalf("$%s=%q is not a non-empty JSON array of strings: %v", variable, raw, err)
	}
	return argv
}

// ---------------------------------------------------------------------------------------------
// The runtime's log, and what it tells about the plugin's connection

// activeTracker receives the runtime's log events: NRI logs through one package-level logger, and
// tests run one at a time, so the current test's tracker is global too.
var (
	trackerMu     sync.Mutex
	activeTracker *tracker
)

func setTracker(tr *tracker) {
	trackerMu.Lock()
	activeTracker = tr
	trackerMu.Unlock()
}

func currentTracker() *tracker {
	trackerMu.Lock()
	defer trackerMu.Unlock()
	return activeTracker
}

type hookLogger struct{}

func (hookLogger) Debugf(_ context.Context, format string, args ...interface{}) {
	if *debugLog {
		logLine("debug", format, args...)
	}
}
func (hookLogger) Infof(_ context.Context, format string, args ...interface{}) {
	logLine("info", format, args...)
}
func (hookLogger) Warnf(_ context.Context, format string, args ...interface{}) {
	logLine("warn", format, args...)
}
func (hookLogger) Errorf(_ context.Context, format string, args ...interface{}) {
	logLine("error", format, args...)
}

// quietLogs are runtime log lines not worth printing.
var quietLogs = []string{
	"failed to initialize WASM support", // built with nri_no_wasm
	"plugin invocation order",
	"  #%d: %q (%s)",
	"runtime interface created",
	"runtime interface starting up...",
	"starting plugins...",
	"connection from external plugins disabled",
	"runtime interface shutting down...",
	"stopping plugins...",
}

func isQuiet(format string) bool {
	for _, q := range quietLogs {
		if strings.HasPrefix(format, q) {
			return true
		}
	}
	return false
}

func logLine(level, format string, args ...interface{}) {
	msg := fmt.Sprintf(format, args...)
	if tr := currentTracker(); tr != nil {
		tr.onLog(format, msg)
	}
	if isQuiet(format) {
		return
	}
	fmt.Fprintf(os.Stderr, "%s [nri] %s: %s\n", time.Now().Format("15:04:05.000"), level, msg)
}
