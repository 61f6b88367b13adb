//go:build linux

package collector_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// fcgiRequest sends one FastCGI request (a GET of script) on conn and
// returns what the script wrote to its standard output: the FastCGI
// protocol's records (1.0), written here so the test needs no web server.
func fcgiRequest(conn net.Conn, script string) (string, error) {
	const (
		beginRequest = 1
		endRequest   = 3
		params       = 4
		stdin        = 5
		stdout       = 6
		stderr       = 7
		id           = 1
	)
	record := func(typ byte, body []byte) []byte {
		h := []byte{1, typ, 0, id, byte(len(body) >> 8), byte(len(body)), 0, 0}
		return append(h, body...)
	}
	pair := func(name, value string) []byte {
		var b []byte
		for _, n := range []int{len(name), len(value)} {
			if n < 128 {
				b = append(b, byte(n))
			} else {
				b = binary.BigEndian.AppendUint32(b, uint32(n)|1<<31)
			}
		}
		return append(append(b, name...), value...)
	}
	var p []byte
	for _, kv := range [][2]string{
		{"SCRIPT_FILENAME", script}, {"SCRIPT_NAME", "/" + filepath.Base(script)},
		{"REQUEST_METHOD", "GET"}, {"SERVER_PROTOCOL", "HTTP/1.1"}, {"GATEWAY_INTERFACE", "CGI/1.1"},
		{"REMOTE_ADDR", "127.0.0.1"}, {"SERVER_NAME", "localhost"}, {"SERVER_PORT", "80"},
	} {
		p = append(p, pair(kv[0], kv[1])...)
	}
	var req []byte
	req = append(req, record(beginRequest, []byte{0, 1, 0, 0, 0, 0, 0, 0})...) // responder, close after
	req = append(req, record(params, p)...)
	req = append(req, record(params, nil)...)
	req = append(req, record(stdin, nil)...)
	if _, err := conn.Write(req); err != nil {
		return "", err
	}
	var out, errOut bytes.Buffer
	for {
		var h [8]byte
		if _, err := io.ReadFull(conn, h[:]); err != nil {
			return "", fmt.Errorf("read record: %w", err)
		}
		body := make([]byte, int(h[4])<<8|int(h[5])+int(h[6]))
		if _, err := io.ReadFull(conn, body); err != nil {
			return "", fmt.Errorf("read record: %w", err)
		}
		body = body[:int(h[4])<<8|int(h[5])]
		switch h[1] {
		case stdout:
			out.Write(body)
		case stderr:
			errOut.Write(body)
		case endRequest:
			if errOut.Len() > 0 {
				return out.String(), fmt.Errorf("script error: %s", errOut.String())
			}
			return out.String(), nil
		}
	}
}

// startFPM runs PHP-FPM with one static pool of workers listening on a
// local TCP port, and returns the port and the workers' pids.
func startFPM(t *testing.T, fpm testutil.Interpreter, workers int) (string, []int) {
	t.Helper()
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close() // the port FPM listens on
	conf := fmt.Sprintf(`[global]
pid = %[1]s/fpm.pid
error_log = %[1]s/fpm.log
daemonize = no
[sonde]
listen = %[2]s
pm = static
pm.max_children = %[3]d
catch_workers_output = yes
`, dir, addr, workers)
	path := filepath.Join(dir, "fpm.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"-n", "-y", path, "-F", "-d", "zend_extension=opcache.so", "-d", "opcache.enable=1"}
	if os.Geteuid() == 0 {
		args = append(args, "-R")
	}
	cmd := fpm.Command(args...)
	// Its workers are the master's children, which outlive a killed
	// master: the whole process group goes at the end.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	testutil.StartCmd(t, cmd)
	pgid := cmd.Process.Pid
	t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if pids := childrenOf(cmd.Process.Pid); len(pids) == workers {
			if c, err := net.Dial("tcp", addr); err == nil {
				_ = c.Close()
				return addr, pids
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	log, _ := os.ReadFile(filepath.Join(dir, "fpm.log"))
	t.Fatalf("php-fpm did not start %d workers on %s:\n%s", workers, addr, log)
	return "", nil
}

// childrenOf lists the children of pid.
func childrenOf(pid int) []int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// TestPHPFPMStacks runs Debian's PHP-FPM (12's 8.2 and 13's 8.4) with three workers of one pool
// (opcache on, as FPM runs by default), started before the receiver as on
// a web host, and a local FastCGI client sending requests of fpm_burn.php
// on three connections. From the first sample in gamma_burn on, at least
// 99 % of each worker's carry the whole chain with files and lines, then
// FPM's native frames down to php_execute_script; every worker is seen.
func TestPHPFPMStacks(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver")
	for _, fpm := range []testutil.Interpreter{testutil.PHPFPM82(t), testutil.PHPFPM84(t)} {
		t.Run(fpm.Version, func(t *testing.T) { testPHPFPMStacks(t, fpm) })
	}
}

func testPHPFPMStacks(t *testing.T, fpm testutil.Interpreter) {
	const workers = 3
	addr, pids := startFPM(t, fpm, workers)
	sink := startReceiver(t, jvmRate)

	script := phpScript(t, "fpm_burn.php")
	var served atomic.Int64
	var reqErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				conn, err := net.Dial("tcp", addr)
				if err == nil {
					_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
					var out string
					out, err = fcgiRequest(conn, script)
					_ = conn.Close()
					if err == nil && !strings.Contains(out, "sum ") {
						err = fmt.Errorf("response %q", out)
					}
				}
				if err != nil {
					reqErr.CompareAndSwap(nil, err)
					return
				}
				served.Add(1)
			}
		}()
	}
	t.Cleanup(func() { close(stop); wg.Wait() })

	at := func(text string) int64 { return phpLineOf(t, "fpm_lib.php", text) }
	c := phpChain{mode: "fpm", chain: []phpWant{
		{"gamma_burn", "fpm_lib.php", at("function gamma_burn(int $n): int"), true},
		{"beta", "fpm_lib.php", at("return gamma_burn($n) + 1;"), false},
		{"alpha", "fpm_lib.php", at("return beta($n) + 1;"), false},
		{"handle", "fpm_burn.php", phpLineOf(t, "fpm_burn.php", `return "sum " . alpha($n) . "\n";`), false},
		{"{main}", "fpm_burn.php", phpLineOf(t, "fpm_burn.php", "echo handle(300000);"), false},
	}}
	chains := map[int64]phpChain{}
	for _, pid := range pids {
		chains[int64(pid)] = c
	}
	const n = 60 // leaf samples of each worker
	got := collectPHP(sink, chains, n, 3*time.Minute)
	if err, _ := reqErr.Load().(error); err != nil {
		t.Fatalf("after %d requests: %v", served.Load(), err)
	}
	t.Logf("%d requests served", served.Load())
	for pid, tl := range got {
		t.Logf("php-fpm worker %d: %d of %d leaf samples whole (%.2f %%)", pid, tl.whole, tl.leaf,
			100*float64(tl.whole)/float64(max(tl.leaf, 1)))
		for _, b := range tl.bad {
			t.Logf("  not whole: %s", b)
		}
		if tl.leaf < n {
			t.Errorf("worker %d: %d samples in gamma_burn, want %d", pid, tl.leaf, n)
		}
		if tl.whole*100 < tl.leaf*99 {
			t.Errorf("worker %d: %d of %d leaf samples whole, want 99 %%", pid, tl.whole, tl.leaf)
		}
	}
	if len(got) != workers {
		t.Errorf("%d workers seen, want %d", len(got), workers)
	}
}
