package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// ---------------------------------------------------------------------------------------------
// tracker: what the runtime saw of the plugin, from its log, its ttrpc traffic and its syncFn

type syncRecord struct {
	pods, ctrs int
	chunks     []int // request payload bytes of each Synchronize message the plugin answered
	refused    int   // Synchronize messages the runtime's ttrpc refused to send (over 4 MiB)
	began      time.Time
	dur        time.Duration
	err        error
	done       bool
}

type callRecord struct {
	method    string // bare RPC name: CreateContainer, StateChange, ...
	reqBytes  int
	respBytes int
	code      codes.Code // the ttrpc status the plugin answered (OK on success)
	msg       string
	err       error // transport/deadline error, nil when the plugin answered
	dur       time.Duration
}

type registerRecord struct {
	name, idx, detail string
}

type configureRecord struct {
	events int32
	detail string
	code   codes.Code
	err    error
}

type tracker struct {
	mu          sync.Mutex
	changed     chan struct{}
	connected   int
	connectedAt []time.Time
	closed      int
	dropped     []string
	failures    []string
	syncs       []*syncRecord
	inSync      *syncRecord
	calls       []callRecord
	registers   []registerRecord
	configures  []configureRecord
	updates     int
	pluginCount int
	logTail     []string
}

func newTracker() *tracker {
	return &tracker{changed: make(chan struct{}), pluginCount: -1}
}

// notify wakes every waiter; the caller holds tr.mu.
func (tr *tracker) notify() {
	close(tr.changed)
	tr.changed = make(chan struct{})
}

func (tr *tracker) changedChan() <-chan struct{} {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.changed
}

func (tr *tracker) get(f func(tr *tracker)) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	f(tr)
}

func (tr *tracker) onLog(format, msg string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if !isQuiet(format) {
		tr.logTail = append(tr.logTail, msg)
	}
	if len(tr.logTail) > 40 {
		tr.logTail = tr.logTail[len(tr.logTail)-40:]
	}
	switch {
	// v0.6.1: `plugin %q connected` (also logged after a failed sync); v0.12: `... connected and synchronized`
	case strings.HasPrefix(format, "plugin %q connected"):
		if n := len(tr.syncs); n > 0 && tr.syncs[n-1].done && tr.syncs[n-1].err == nil {
			tr.connected++
			tr.connectedAt = append(tr.connectedAt, time.Now())
		}
	case strings.HasPrefix(format, "connection to plugin %q closed"):
		tr.closed++
	case strings.HasPrefix(format, "closing plugin %s, failed to handle"):
		tr.dropped = append(tr.dropped, msg)
	case strings.HasPrefix(format, "failed to start external plugin"),
		strings.HasPrefix(format, "failed to synchronize plugin"),
		strings.HasPrefix(format, "failed to create external plugin"):
		tr.failures = append(tr.failures, msg)
	default:
		return
	}
	tr.notify()
}

func (tr *tracker) beginSync(pods, ctrs int) *syncRecord {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	rec := &syncRecord{pods: pods, ctrs: ctrs, began: time.Now()}
	tr.syncs = append(tr.syncs, rec)
	tr.inSync = rec
	tr.notify()
	return rec
}

func (tr *tracker) endSync(rec *syncRecord, err error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	rec.dur, rec.err, rec.done = time.Since(rec.began), err, true
	tr.inSync = nil
	tr.notify()
}

// clientInterceptor sees every call the runtime makes to the plugin (Configure, Synchronize,
// CreateContainer, StateChange, RemoveContainer, ...) on the wire.
func (tr *tracker) clientInterceptor(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response,
	info *ttrpc.UnaryClientInfo, invoker ttrpc.Invoker) error {
	began := time.Now()
	err := invoker(ctx, req, resp)
	rec := callRecord{
		method: path.Base(info.FullMethod), reqBytes: len(req.Payload), respBytes: len(resp.Payload),
		err: err, dur: time.Since(began), code: codes.OK,
	}
	if err == nil && resp.Status != nil {
		rec.code, rec.msg = codes.Code(resp.Status.Code), resp.Status.Message
	} else if err != nil {
		rec.code = status.Code(err)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.calls = append(tr.calls, rec)
	switch rec.method {
	case "Synchronize":
		switch {
		case tr.inSync == nil:
		case err == nil:
			tr.inSync.chunks = append(tr.inSync.chunks, len(req.Payload))
		case rec.code == codes.ResourceExhausted && len(req.Payload) > 4<<20:
			tr.inSync.refused++
		}
	case "Configure":
		c := configureRecord{code: rec.code, err: err}
		creq, cresp := &api.ConfigureRequest{}, &api.ConfigureResponse{}
		if proto.Unmarshal(req.Payload, creq) == nil {
			c.detail = configureDetail(creq)
		}
		if err == nil && proto.Unmarshal(resp.Payload, cresp) == nil {
			c.events = cresp.Events
		}
		tr.configures = append(tr.configures, c)
	}
	tr.notify()
	return err
}

// serverInterceptor sees the plugin's calls to the runtime (RegisterPlugin, UpdateContainers).
func (tr *tracker) serverInterceptor(ctx context.Context, unmarshal ttrpc.Unmarshaler,
	info *ttrpc.UnaryServerInfo, method ttrpc.Method) (interface{}, error) {
	switch path.Base(info.FullMethod) {
	case "RegisterPlugin":
		req := &api.RegisterPluginRequest{}
		if err := unmarshal(req); err == nil {
			tr.mu.Lock()
			tr.registers = append(tr.registers, registerRecord{req.PluginName, req.PluginIdx, registerDetail(req)})
			tr.notify()
			tr.mu.Unlock()
		}
	case "UpdateContainers":
		tr.mu.Lock()
		tr.updates++
		tr.mu.Unlock()
	}
	return method(ctx, unmarshal)
}

func (tr *tracker) setPluginCount(n int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.pluginCount = n
	tr.notify()
}

// callsSince returns the calls of one method made after the first `from` calls.
func (tr *tracker) callsSince(from int, method string) []callRecord {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []callRecord
	for _, c := range tr.calls[from:] {
		if method == "" || c.method == method {
			out = append(out, c)
		}
	}
	return out
}

func (tr *tracker) numCalls() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return len(tr.calls)
}

func (tr *tracker) diagnostics() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "runtime's view: %d registrations, %d configures, %d syncs, %d connected+synchronized, "+
		"%d connection closes, %d drops\n", len(tr.registers), len(tr.configures), len(tr.syncs), tr.connected,
		tr.closed, len(tr.dropped))
	for i, s := range tr.syncs {
		fmt.Fprintf(&b, "  sync #%d: %d pods, %d containers, %d chunk(s) answered, done=%v after %s, err=%v\n",
			i+1, s.pods, s.ctrs, len(s.chunks), s.done, s.dur.Round(time.Millisecond), s.err)
	}
	for _, c := range tr.configures {
		fmt.Fprintf(&b, "  configure: events 0x%x (%s), %s, code %v, err %v\n", c.events, eventNames(c.events), c.detail, c.code, c.err)
	}
	for _, f := range tr.failures {
		fmt.Fprintf(&b, "  runtime failure: %s\n", f)
	}
	for _, d := range tr.dropped {
		fmt.Fprintf(&b, "  runtime drop: %s\n", d)
	}
	if n := len(tr.calls); n > 0 {
		from := max(0, n-8)
		fmt.Fprintf(&b, "  last %d calls to the plugin:\n", n-from)
		for _, c := range tr.calls[from:] {
			fmt.Fprintf(&b, "    %s: %d -> %d bytes, %v %q, err %v, %s\n", c.method, c.reqBytes, c.respBytes, c.code, c.msg, c.err, c.dur.Round(time.Microsecond))
		}
	}
	b.WriteString("  last runtime log lines:\n")
	for _, l := range tr.logTail[max(0, len(tr.logTail)-12):] {
		fmt.Fprintf(&b, "    %s\n", l)
	}
	return b.String()
}

func eventNames(mask int32) string {
	if mask == 0 {
		return "0 = all events"
	}
	var names []string
	for e := int32(1); e < 32; e++ {
		if mask&(1<<(e-1)) != 0 {
			names = append(names, api.Event(e).String())
		}
	}
	return strings.Join(names, ",")
}

// ---------------------------------------------------------------------------------------------
// env: one runtime (Adaptation) + one plugin process, per test

type envOptions struct {
	pods      []*api.PodSandbox
	ctrs      []*api.Container
	cmdVar    string // the variable holding the plugin command line (default VGPUD_NRI_PLUGIN_CMD)
	noPlugin  bool
	extraArgs []string
	control   bool // start the plugin with --control <dir>/control.sock (hotplug.go)
}

type env struct {
	t      testing.TB
	dir    string
	sock   string
	root   string
	report string
	a      *adaptation.Adaptation
	base   *adaptation.Adaptation // no plugins: the merged response of "nothing adjusted"
	tr     *tracker
	plugin *pluginProc

	stateMu sync.Mutex
	started bool // Start() has returned: syncFn calls are plugin connections
	pods    []*api.PodSandbox
	ctrs    []*api.Container
	// the plugin's unsolicited UpdateContainers as the runtime's updateFn got them, and what it answers
	updates     [][]*api.ContainerUpdate
	updateReply func([]*api.ContainerUpdate) ([]*api.ContainerUpdate, error)
}

func newEnv(t testing.TB, opts envOptions) *env {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "vgn")
	if err != nil {
		t.Fatal(err)
	}
	if dir, err = filepath.EvalSymlinks(dir); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dir: dir, sock: filepath.Join(dir, "nri.sock"), root: filepath.Join(dir, "root"),
		report: filepath.Join(dir, "sync.jsonl"), tr: newTracker(), pods: opts.pods, ctrs: opts.ctrs}
	for _, d := range []string{e.root, filepath.Join(dir, "plugins"), filepath.Join(dir, "conf")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	setTracker(e.tr)
	t.Cleanup(e.close)

	syncFn := func(ctx context.Context, cb adaptation.SyncCB) error {
		e.stateMu.Lock()
		pods, ctrs, started := e.pods, e.ctrs, e.started
		e.stateMu.Unlock()
		if !started { // Start() synchronizes the pre-installed plugins (none)
			_, err := cb(ctx, pods, ctrs)
			return err
		}
		rec := e.tr.beginSync(len(pods), len(ctrs))
		_, err := cb(ctx, pods, ctrs)
		e.tr.endSync(rec, err)
		return err
	}
	updateFn := func(_ context.Context, u []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) {
		e.stateMu.Lock()
		got := make([]*api.ContainerUpdate, len(u))
		for i, c := range u {
			got[i] = proto.Clone(c).(*api.ContainerUpdate)
		}
		e.updates = append(e.updates, got)
		reply := e.updateReply
		e.stateMu.Unlock()
		e.tr.get(func(tr *tracker) { tr.notify() })
		if reply == nil {
			return nil, nil
		}
		return reply(u)
	}
	ttrpcOpts := adaptation.WithTTRPCOptions(
		[]ttrpc.ClientOpts{ttrpc.WithUnaryClientInterceptor(e.tr.clientInterceptor)},
		[]ttrpc.ServerOpt{ttrpc.WithUnaryServerInterceptor(e.tr.serverInterceptor)})
	options := append([]adaptation.Option{
		adaptation.WithSocketPath(e.sock),
		adaptation.WithPluginPath(filepath.Join(dir, "plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(dir, "conf")),
		ttrpcOpts,
	}, metricsOptions(e.tr)...)
	if e.a, err = adaptation.New("containerd", runtimeVersion, syncFn, updateFn, options...); err != nil {
		t.Fatalf("adaptation.New: %v", err)
	}
	if err := e.a.Start(); err != nil {
		t.Fatalf("adaptation.Start: %v", err)
	}
	e.stateMu.Lock()
	e.started = true
	e.stateMu.Unlock()
	baseSync := func(ctx context.Context, cb adaptation.SyncCB) error { _, err := cb(ctx, nil, nil); return err }
	if e.base, err = adaptation.New("baseline", "v0", baseSync, updateFn,
		adaptation.WithPluginPath(filepath.Join(dir, "plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(dir, "conf")),
		adaptation.WithDisabledExternalConnections()); err != nil {
		t.Fatalf("baseline adaptation.New: %v", err)
	}
	if err := e.base.Start(); err != nil {
		t.Fatalf("baseline adaptation.Start: %v", err)
	}
	if !opts.noPlugin {
		variable := opts.cmdVar
		if variable == "" {
			variable = "VGPUD_NRI_PLUGIN_CMD"
		}
		extra := opts.extraArgs
		if opts.control {
			extra = append([]string{"--control", e.controlPath()}, extra...)
		}
		e.startPlugin(pluginCommand(t, variable), extra...)
	}
	return e
}

// pluginArgs is the contract of README.md: what every plugin under test is started with.
func (e *env) pluginArgs() []string {
	args := []string{"--socket", e.sock, "--manager-root", e.root, "--idx", pluginIdx, "--backoff", "0.1",
		"--delay-container", slowContainer + "=1", "--sync-report", e.report}
	for _, c := range preparedClaims {
		args = append(args, "--prepared-claim", c)
	}
	return args
}

func (e *env) startPlugin(argv []string, extra ...string) {
	e.t.Helper()
	full := append(append(append([]string{}, argv...), e.pluginArgs()...), extra...)
	p, err := startPlugin(full)
	if err != nil {
		e.t.Fatalf("cannot start the plugin %q: %v", full, err)
	}
	e.plugin = p
}

func (e *env) close() {
	if e.plugin != nil {
		closed := 0
		e.tr.get(func(tr *tracker) { closed = tr.closed })
		if err := e.plugin.stop(); err != nil {
			e.t.Errorf("stopping the plugin: %v", err)
		}
		// let the runtime notice before the next test's tracker takes over the log
		e.waitQuietly(time.Second, func(tr *tracker) bool { return tr.closed > closed || tr.connected == 0 })
	}
	if e.a != nil {
		e.a.Stop()
	}
	if e.base != nil {
		e.base.Stop()
	}
	setTracker(nil)
	if !e.t.Failed() || os.Getenv("VGPUD_NRI_KEEP") == "" {
		os.RemoveAll(e.dir)
	} else {
		fmt.Fprintf(os.Stderr, "kept %s (VGPUD_NRI_KEEP)\n", e.dir)
	}
}

func (e *env) setState(pods []*api.PodSandbox, ctrs []*api.Container) {
	e.stateMu.Lock()
	defer e.stateMu.Unlock()
	e.pods, e.ctrs = pods, ctrs
}

// waitFor waits until cond holds, failing the test (with the runtime's view) on timeout or when
// the plugin process exits. cond is re-checked on every tracker change and every 20 ms.
func (e *env) waitFor(what string, timeout time.Duration, cond func(tr *tracker) bool) {
	e.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		ch := e.tr.changedChan()
		ok := false
		e.tr.get(func(tr *tracker) { ok = cond(tr) })
		if ok {
			return
		}
		var exited <-chan struct{}
		if e.plugin != nil {
			exited = e.plugin.exited
		}
		select {
		case <-ch:
		case <-time.After(20 * time.Millisecond):
		case <-exited:
			e.tr.get(func(tr *tracker) { ok = cond(tr) })
			if !ok {
				e.t.Fatalf("while waiting for %s, the plugin process exited: %v\n%s%s", what, e.plugin.waitErr,
					e.plugin.out.lastLines(), e.tr.diagnostics())
			}
			return
		case <-deadline.C:
			e.t.Fatalf("timed out after %s waiting for %s\n%s", timeout, what, e.tr.diagnostics())
		}
	}
}

func (e *env) waitQuietly(timeout time.Duration, cond func(tr *tracker) bool) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		ch := e.tr.changedChan()
		ok := false
		e.tr.get(func(tr *tracker) { ok = cond(tr) })
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-time.After(20 * time.Millisecond):
		}
	}
	return false
}

// waitConnected waits until the runtime has registered, configured and synchronized the plugin
// n times in all (the runtime logs `plugin "00-manager.nvidia.com" connected` after adding it).
func (e *env) waitConnected(n int, timeout time.Duration) {
	e.t.Helper()
	e.waitFor(fmt.Sprintf("connection #%d of the plugin (registered, configured, synchronized, added by the runtime)", n),
		timeout, func(tr *tracker) bool { return tr.connected >= n })
}

// create calls the runtime's CreateContainer with a copy of req (the runtime edits its request).
func (e *env) create(req *api.CreateContainerRequest) (*api.CreateContainerResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return e.a.CreateContainer(ctx, proto.Clone(req).(*api.CreateContainerRequest))
}

// baseline is what the runtime returns for req when no plugin changes anything.
func (e *env) baseline(req *api.CreateContainerRequest) *api.CreateContainerResponse {
	e.t.Helper()
	resp, err := e.base.CreateContainer(context.Background(), proto.Clone(req).(*api.CreateContainerRequest))
	if err != nil {
		e.t.Fatalf("baseline CreateContainer: %v", err)
	}
	return resp
}

// ---------------------------------------------------------------------------------------------
// the plugin process

type pluginProc struct {
	argv    []string
	cmd     *exec.Cmd
	out     *prefixWriter
	started time.Time
	exited  chan struct{}
	waitErr error
}

func startPlugin(argv []string) (*pluginProc, error) {
	p := &pluginProc{argv: argv, exited: make(chan struct{}), out: &prefixWriter{prefix: "[plugin]"}}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.WaitDelay = 2 * time.Second
	fmt.Fprintf(os.Stderr, "%s [harness] starting the plugin: %s\n", time.Now().Format("15:04:05.000"), strings.Join(argv, " "))
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		p.out.flush()
		close(p.exited)
	}()
	return p, nil
}

func (p *pluginProc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM to the plugin's PID and waits 5 s for exit status 0; then SIGKILL.
func (p *pluginProc) stop() error {
	if !p.alive() {
		return fmt.Errorf("the plugin process had exited before the test ended: %v\n%s", p.waitErr, p.out.lastLines())
	}
	pid := p.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("SIGTERM to plugin pid %d: %w", pid, err)
	}
	select {
	case <-p.exited:
		if p.waitErr != nil {
			return fmt.Errorf("after SIGTERM the plugin (pid %d) exited with %v; want exit status 0", pid, p.waitErr)
		}
		return nil
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(pid, syscall.SIGKILL)
		<-p.exited
		return fmt.Errorf("the plugin (pid %d) did not exit within 5 s of SIGTERM; killed", pid)
	}
}

// prefixWriter streams a child's output to stderr line by line, with a timestamp and a prefix.
type prefixWriter struct {
	mu     sync.Mutex
	prefix string
	buf    bytes.Buffer
	tail   []string // the last lines, for failure messages
}

func (w *prefixWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(b)
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.Reset()
			w.buf.WriteString(line)
			break
		}
		w.emit(strings.TrimRight(line, "\n"))
	}
	return len(b), nil
}

func (w *prefixWriter) emit(line string) {
	const maxLine = 2000
	if len(line) > maxLine {
		line = fmt.Sprintf("%s... (%d bytes)", line[:maxLine], len(line))
	}
	fmt.Fprintf(os.Stderr, "%s %s %s\n", time.Now().Format("15:04:05.000"), w.prefix, line)
	if len(line) > 300 {
		line = line[:300] + "..."
	}
	w.tail = append(w.tail, line)
	if len(w.tail) > 15 {
		w.tail = w.tail[len(w.tail)-15:]
	}
}

// lastLines is the plugin's last output, indented, for failure messages.
func (w *prefixWriter) lastLines() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.tail) == 0 {
		return "  the plugin printed nothing\n"
	}
	return "  the plugin's last output lines:\n    " + strings.Join(w.tail, "\n    ") + "\n"
}

func (w *prefixWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.buf.Len() > 0 {
		w.emit(w.buf.String())
		w.buf.Reset()
	}
}

// isStatus tells whether err carries a gRPC/ttrpc status with this code.
func isStatus(err error, code codes.Code) bool {
	var se interface{ GRPCStatus() *status.Status }
	return errors.As(err, &se) && se.GRPCStatus().Code() == code
}
