package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// What the bench reads of a running process from /proc, and the
// distribution run as a process.

// procStatus is the memory lines of /proc/PID/status, in KiB.
type procStatus struct {
	HWM, RSS, Anon, File, Shmem float64
}

func readStatus(pid int) (procStatus, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procStatus{}, fmt.Errorf("status of %d: %w", pid, err)
	}
	var st procStatus
	fields := map[string]*float64{"VmHWM:": &st.HWM, "VmRSS:": &st.RSS, "RssAnon:": &st.Anon, "RssFile:": &st.File, "RssShmem:": &st.Shmem}
	for line := range strings.SplitSeq(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && fields[f[0]] != nil {
			*fields[f[0]], _ = strconv.ParseFloat(f[1], 64)
		}
	}
	if st.HWM == 0 {
		return st, fmt.Errorf("status of %d: no VmHWM", pid)
	}
	return st, nil
}

// readCPU is utime+stime of pid (all its threads), in seconds.
func readCPU(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("stat of %d: %w", pid, err)
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return 0, fmt.Errorf("stat of %d: malformed", pid)
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("stat of %d: malformed", pid)
	}
	u, err1 := strconv.ParseFloat(f[11], 64)
	k, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("stat of %d: %w", pid, err)
	}
	return (u + k) / 100, nil // USER_HZ
}

// progStat is one BPF program's run-time statistics from fdinfo.
type progStat struct {
	Type          int
	RunNs, RunCnt uint64
	MemlockBytes  uint64
}

// fdObjects is what the BPF objects pid holds descriptors of cost: the
// kernel's memlock of each distinct map and program, and the programs'
// run-time statistics (counted while kernel.bpf_stats_enabled is on).
type fdObjects struct {
	Maps      int
	MapBytes  uint64
	ProgBytes uint64
	Progs     map[uint64]progStat // by program id
}

// BPF_PROG_TYPE_PERF_EVENT: the programs perf events run, the sampler's.
const progTypePerfEvent = 7

func scanFDInfo(pid int) (fdObjects, error) {
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fdObjects{}, fmt.Errorf("descriptors of %d: %w", pid, err)
	}
	out := fdObjects{Progs: map[uint64]progStat{}}
	maps := map[uint64]bool{}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed since
		}
		kv := map[string]string{}
		for line := range strings.SplitSeq(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				kv[k] = strings.TrimSpace(v)
			}
		}
		num := func(k string) uint64 { n, _ := strconv.ParseUint(kv[k], 10, 64); return n }
		switch {
		case kv["map_id"] != "":
			if id := num("map_id"); !maps[id] {
				maps[id] = true
				out.MapBytes += num("memlock")
			}
		case kv["prog_id"] != "":
			id := num("prog_id")
			if _, seen := out.Progs[id]; seen {
				continue
			}
			typ, _ := strconv.Atoi(kv["prog_type"])
			out.Progs[id] = progStat{Type: typ, RunNs: num("run_time_ns"), RunCnt: num("run_cnt"), MemlockBytes: num("memlock")}
			out.ProgBytes += num("memlock")
		}
	}
	out.Maps = len(maps)
	return out, nil
}

// perfEventRuns sums the run time and runs of the perf-event programs, as
// ../shared/reference/sidebyside does: a tail-called program's time is in
// its caller's, and its own count stays 0.
func (f fdObjects) perfEventRuns() (ns, runs uint64) {
	for _, p := range f.Progs {
		if p.Type == progTypePerfEvent {
			ns += p.RunNs
			runs += p.RunCnt
		}
	}
	return ns, runs
}

// freePort returns a TCP port on 127.0.0.1 nothing listens on now.
func freePort(b *testing.B) int {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer testutil.Close(b, l)
	return l.Addr().(*net.TCPAddr).Port
}

// distProcess is a run of the distribution: its output goes to a log file
// and is watched for the lines that mark it ready and each export.
type distProcess struct {
	cmd   *exec.Cmd
	start time.Time
	log   string
	done  chan struct{} // closed when the process has exited
	err   error         // Wait's, once done

	mu          sync.Mutex
	ready       time.Duration // since start; 0 until "Everything is ready"
	firstExport time.Duration // since start; 0 until the debug exporter's first line
	exports     int
	tail        []string
}

// Log lines of the Collector's service and debug exporter the bench waits on.
const (
	readyLine  = "Everything is ready"
	exportLine = "sample records"
)

// startCollector runs bin --config cfg with the profiles feature gate; its
// output goes to logPath. It dies with the bench (Pdeathsig) and is killed
// at the end of the benchmark if still running.
func startCollector(b *testing.B, bin, cfg, logPath string) *distProcess {
	b.Helper()
	fromDisk(b, bin)
	return startProcess(b, []string{bin, "--config", cfg, featureGateFlag}, logPath)
}

// fromDisk drops bin's pages from the page cache (after writing back any
// still dirty), so that the process started next reads it from disk, as a
// node reads an agent's binary from its image. How many of a binary's
// pages a process maps (the file part of its RSS) depends on how the file
// came into the cache: straight after the linker wrote it, in large
// folios, the distribution mapped half as much again as read from disk.
// Each agent of a comparison is started so.
func fromDisk(b *testing.B, bin string) {
	b.Helper()
	f, err := os.Open(bin)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		b.Fatalf("write back %s: %v", bin, err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		b.Fatalf("drop %s from the page cache: %v", bin, err)
	}
}

// startProcess starts a collector from its command line (the reference's
// goes through run-reference), its output in logPath, as startCollector.
func startProcess(b *testing.B, argv []string, logPath string) *distProcess {
	b.Helper()
	logf, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	c := &distProcess{log: logPath, done: make(chan struct{})}
	c.cmd = exec.Command(argv[0], argv[1:]...)
	c.cmd.Stdout, c.cmd.Stderr = pw, pw
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	c.start = time.Now()
	if err := c.cmd.Start(); err != nil {
		b.Fatalf("start %s: %v", argv[0], err)
	}
	pw.Close()
	go func() {
		defer logf.Close()
		sc := bufio.NewScanner(io.TeeReader(pr, logf))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line, at := sc.Text(), time.Since(c.start)
			c.mu.Lock()
			if c.ready == 0 && strings.Contains(line, readyLine) {
				c.ready = at
			}
			if strings.Contains(line, exportLine) {
				if c.exports == 0 {
					c.firstExport = at
				}
				c.exports++
			}
			c.tail = append(c.tail, line)
			if len(c.tail) > 20 {
				c.tail = c.tail[1:]
			}
			c.mu.Unlock()
		}
		_, _ = io.Copy(logf, pr)
	}()
	go func() {
		c.err = c.cmd.Wait()
		pr.Close()
		close(c.done)
	}()
	b.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.done
	})
	return c
}

func (c *distProcess) pid() int { return c.cmd.Process.Pid }

func (c *distProcess) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// lastLines is the end of the collector's output, for error messages.
func (c *distProcess) lastLines() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.tail, "\n")
}

func (c *distProcess) events() (ready, firstExport time.Duration, exports int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ready, c.firstExport, c.exports
}

// awaitReady waits until the collector logs that it is ready, or fails.
func (c *distProcess) awaitReady(b *testing.B, within time.Duration) {
	b.Helper()
	deadline := time.Now().Add(within)
	for {
		if r, _, _ := c.events(); r > 0 {
			return
		}
		if c.exited() {
			b.Fatalf("%s exited before it was ready (%v); log %s:\n%s", c.cmd.Path, c.err, c.log, c.lastLines())
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s not ready after %v; log %s:\n%s", c.cmd.Path, within, c.log, c.lastLines())
		}
		time.Sleep(50 * time.Millisecond) // polling a condition with a deadline
	}
}

// stop interrupts the collector as a user would (Ctrl-C) and waits for it
// to exit; it kills it after within. It returns how long the shutdown took
// and an error if the collector did not exit cleanly.
func (c *distProcess) stop(within time.Duration) (time.Duration, error) {
	if c.exited() {
		return 0, fmt.Errorf("%s had exited: %w", c.cmd.Path, c.err)
	}
	begin := time.Now()
	_ = c.cmd.Process.Signal(os.Interrupt)
	select {
	case <-c.done:
	case <-time.After(within):
		_ = c.cmd.Process.Kill()
		<-c.done
		return time.Since(begin), fmt.Errorf("%s did not exit within %v of SIGINT", c.cmd.Path, within)
	}
	if c.err != nil {
		return time.Since(begin), fmt.Errorf("%s exited with %w", c.cmd.Path, c.err)
	}
	return time.Since(begin), nil
}

// scrape reads the collector's Prometheus endpoint.
func scrape(url string) (promScrape, error) {
	client := http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return nil, fmt.Errorf("scrape: %w", err)
	}
	defer func() { _ = resp.Body.Close() }() // read to the end below, or failed
	var body bytes.Buffer
	if _, err := io.Copy(&body, resp.Body); err != nil {
		return nil, fmt.Errorf("scrape: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape: %s", resp.Status)
	}
	return parseProm(body.String())
}
