package sqliteexporter

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer/consumererror"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.uber.org/zap"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/sonde-dev/sonde/exporter/sqliteexporter/internal/metadata"
	"github.com/sonde-dev/sonde/internal/profileview"
)

// Attribute keys given columns of their own.
const (
	attrServiceName = "service.name"
	attrExeName     = "process.executable.name"
	attrPID         = "process.pid"
	attrContainerID = "container.id"
	attrThreadID    = "thread.id"
	attrThreadName  = "thread.name"
	attrCPU         = "cpu.logical_number"
)

const (
	// maxCached bounds each id cache; a full cache is emptied, which costs
	// lookups in the database, never data.
	maxCached = 1 << 16
	// retentionEvery spaces the deletion by age and the removal of rows no
	// sample refers to any more: each scans indexes of the whole database.
	retentionEvery = time.Minute
	// sizeDeleteFraction is the share of intervals, oldest first, one round
	// of deletion by size removes (at least one).
	sizeDeleteFraction = 0.1
)

// Attribute sets of the exporter's own metrics.
var (
	outcomeWritten = metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", "written")))
	outcomeDropped = metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", "dropped")))
	reasonMaxAge   = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "max_age")))
	reasonMaxSize  = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "max_size")))
)

type functionKey struct{ name, system, file string }

type frameKey struct {
	typ      string
	function int64 // 0: none
	line     int64
	address  uint64
	mapping  string
}

// sqliteExporter writes each export as one interval in one transaction. Its
// methods are safe for concurrent use: a mutex serializes writes, retention
// and the id caches, which hold only ids of committed rows.
type sqliteExporter struct {
	cfg    *Config
	logger *zap.Logger
	tb     *metadata.TelemetryBuilder
	now    func() time.Time

	mu            sync.Mutex
	db            *sql.DB
	resources     map[string]int64
	functions     map[functionKey]int64
	frames        map[frameKey]int64
	stacks        map[[16]byte]int64
	lastRetention time.Time
	failing       bool // the last export failed; log again only after a success
}

func newExporter(cfg *Config, logger *zap.Logger, tb *metadata.TelemetryBuilder, now func() time.Time) *sqliteExporter {
	e := &sqliteExporter{cfg: cfg, logger: logger, tb: tb, now: now}
	e.clearCaches()
	return e
}

func (e *sqliteExporter) clearCaches() {
	e.resources = map[string]int64{}
	e.functions = map[functionKey]int64{}
	e.frames = map[frameKey]int64{}
	e.stacks = map[[16]byte]int64{}
}

// dsn opens path in WAL mode with full synchronization: a committed interval
// survives a crash of the process and of the machine. auto_vacuum takes
// effect on a new database only, before its first table.
func dsn(path string) string {
	q := url.Values{}
	for _, p := range []string{
		"auto_vacuum(incremental)", "journal_mode(wal)", "synchronous(full)",
		"busy_timeout(10000)", "journal_size_limit(67108864)",
	} {
		q.Add("_pragma", p)
	}
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + q.Encode()
}

func (e *sqliteExporter) start(ctx context.Context, _ component.Host) error {
	// Create the file first so its mode is the owner's only: profiles carry
	// command lines and environment values. SQLite gives the -wal and -shm
	// files the database's mode.
	f, err := os.OpenFile(e.cfg.Path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("sqlite exporter: create %s: %w", e.cfg.Path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("sqlite exporter: create %s: %w", e.cfg.Path, err)
	}
	db, err := sql.Open("sqlite", dsn(e.cfg.Path))
	if err != nil {
		return fmt.Errorf("sqlite exporter: open %s: %w", e.cfg.Path, err)
	}
	// One connection: writes are serialized anyway, and the pragmas of the
	// DSN then hold for every statement.
	db.SetMaxOpenConns(1)
	if err := initSchema(ctx, db); err != nil {
		_ = db.Close()
		return fmt.Errorf("sqlite exporter: %s: %w", e.cfg.Path, err)
	}
	e.mu.Lock()
	e.db = db
	e.mu.Unlock()
	return nil
}

func initSchema(ctx context.Context, db *sql.DB) error {
	var version int
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return fmt.Errorf("schema version: %w", err)
	}
	switch version {
	case schemaVersion:
		return nil
	case 0:
	default:
		return fmt.Errorf("schema version %d, this exporter writes version %d: use another path", version, schemaVersion)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var tables int
	if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_schema").Scan(&tables); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	if tables != 0 {
		return errors.New("not a database of this exporter (it has tables and no schema version): use another path")
	}
	if _, err := tx.ExecContext(ctx, schema); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", schemaVersion)); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	return nil
}

func (e *sqliteExporter) shutdown(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.db == nil {
		return nil
	}
	err := e.db.Close()
	e.db = nil
	if err != nil {
		return fmt.Errorf("sqlite exporter: close: %w", err)
	}
	return nil
}

// consumeProfiles writes pd as one interval. A failed write is rolled back,
// counted as dropped and returned as permanent: retrying a full disk with
// the same data does not help, and the next interval tries again. An
// interval handed over is written even if the caller's context is then
// cancelled: a receiver shutting down with an emit in flight cancels it,
// and the local write is short (the pprof exporter beside it writes that
// interval too, and the two must hold the same intervals).
func (e *sqliteExporter) consumeProfiles(ctx context.Context, pd pprofile.Profiles) error {
	if pd.SampleCount() == 0 {
		return nil
	}
	ctx = context.WithoutCancel(ctx)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.db == nil {
		return consumererror.NewPermanent(errors.New("sqlite exporter: not started"))
	}
	now := e.now()
	err := e.write(ctx, pd, now)
	if err != nil {
		// Ids cached during the failed transaction name rows that are gone.
		e.clearCaches()
		e.tb.ExporterSqliteIntervals.Add(ctx, 1, outcomeDropped)
		if !e.failing {
			e.logger.Warn("sqlite exporter dropped an interval; logged again only after a write succeeds", zap.Error(err))
		}
		e.failing = true
		return consumererror.NewPermanent(fmt.Errorf("sqlite exporter: %w", err))
	}
	e.failing = false
	e.tb.ExporterSqliteIntervals.Add(ctx, 1, outcomeWritten)
	if err := e.retain(ctx, now); err != nil {
		e.clearCaches()
		e.logger.Warn("sqlite exporter retention failed; old intervals stay until the next try", zap.Error(err))
	}
	return nil
}

// write inserts pd as one interval in one transaction.
func (e *sqliteExporter) write(ctx context.Context, pd pprofile.Profiles, now time.Time) (err error) {
	tx, err := e.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	w := &writer{e: e, tx: tx, ctx: ctx, resByIndex: map[int]int64{}, stackByIndex: map[int32]int64{}}
	if err := w.prepare(); err != nil {
		return err
	}
	defer w.close()

	r := profileview.NewReader(pd)
	res, err := tx.ExecContext(ctx, "INSERT INTO intervals (start_unix_nano, end_unix_nano, written_unix_nano) VALUES (0, 0, ?)", now.UnixNano())
	if err != nil {
		return fmt.Errorf("insert interval: %w", err)
	}
	interval, err := res.LastInsertId()
	if err != nil {
		return fmt.Errorf("insert interval: %w", err)
	}
	var start, end uint64
	for s := range r.Samples() {
		if start == 0 || (s.Start != 0 && s.Start < start) {
			start = s.Start
		}
		end = max(end, s.Start+min(s.Duration, 1<<62))
		if err := w.sample(interval, s); err != nil {
			return err
		}
	}
	if r.Invalid > 0 {
		e.logger.Debug("sqlite exporter skipped references out of range of the profiles dictionary", zap.Int("count", r.Invalid))
	}
	if _, err := tx.ExecContext(ctx, "UPDATE intervals SET start_unix_nano = ?, end_unix_nano = ? WHERE id = ?",
		int64(min(start, 1<<63-1)), int64(min(end, 1<<63-1)), interval); err != nil {
		return fmt.Errorf("update interval: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	w.publish()
	return nil
}

// writer is one export's transaction. New ids go to its own maps and reach
// the exporter's caches only after the commit.
type writer struct {
	e   *sqliteExporter
	tx  *sql.Tx
	ctx context.Context

	insSample, insResource, insFunction, insFrame, insStack, insStackFrame *sql.Stmt
	selResource, selFunction, selFrame, selStack                           *sql.Stmt

	resByIndex   map[int]int64   // resource index of the export -> id
	stackByIndex map[int32]int64 // stack index of the export -> id
	newResources map[string]int64
	newFunctions map[functionKey]int64
	newFrames    map[frameKey]int64
	newStacks    map[[16]byte]int64
	attrs        map[string]any
	frameIDs     []int64
}

func (w *writer) prepare() error {
	for _, p := range []struct {
		st  **sql.Stmt
		sql string
	}{
		{&w.insSample, `INSERT INTO samples (interval_id, time_unix_nano, resource_id, stack_id, sample_type, unit, period, value, events, thread_id, thread_name, cpu, attributes)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`},
		{&w.insResource, "INSERT INTO resources (service_name, executable_name, pid, container_id, attributes) VALUES (?, ?, ?, ?, ?)"},
		{&w.selResource, "SELECT id FROM resources WHERE attributes = ?"},
		{&w.insFunction, "INSERT INTO functions (name, system_name, file) VALUES (?, ?, ?)"},
		{&w.selFunction, "SELECT id FROM functions WHERE name = ? AND system_name = ? AND file = ?"},
		{&w.insFrame, "INSERT INTO frames (frame_type, function_id, line, address, mapping) VALUES (?, ?, ?, ?, ?)"},
		{&w.selFrame, "SELECT id FROM frames WHERE frame_type = ? AND function_id IS ? AND line = ? AND address = ? AND mapping = ?"},
		{&w.insStack, "INSERT INTO stacks (hash, depth, leaf_frame_id, language) VALUES (?, ?, ?, ?)"},
		{&w.selStack, "SELECT id FROM stacks WHERE hash = ?"},
		{&w.insStackFrame, "INSERT INTO stack_frames (stack_id, position, frame_id) VALUES (?, ?, ?)"},
	} {
		st, err := w.tx.PrepareContext(w.ctx, p.sql)
		if err != nil {
			w.close()
			return fmt.Errorf("prepare: %w", err)
		}
		*p.st = st
	}
	w.newResources = map[string]int64{}
	w.newFunctions = map[functionKey]int64{}
	w.newFrames = map[frameKey]int64{}
	w.newStacks = map[[16]byte]int64{}
	return nil
}

func (w *writer) close() {
	for _, st := range []*sql.Stmt{w.insSample, w.insResource, w.insFunction, w.insFrame, w.insStack, w.insStackFrame,
		w.selResource, w.selFunction, w.selFrame, w.selStack} {
		if st != nil {
			_ = st.Close()
		}
	}
}

// publish moves the committed ids into the exporter's caches, emptying a
// cache that would grow past maxCached.
func (w *writer) publish() {
	e := w.e
	if len(e.resources)+len(w.newResources) > maxCached || len(e.functions)+len(w.newFunctions) > maxCached ||
		len(e.frames)+len(w.newFrames) > maxCached || len(e.stacks)+len(w.newStacks) > maxCached {
		e.clearCaches()
	}
	for k, v := range w.newResources {
		e.resources[k] = v
	}
	for k, v := range w.newFunctions {
		e.functions[k] = v
	}
	for k, v := range w.newFrames {
		e.frames[k] = v
	}
	for k, v := range w.newStacks {
		e.stacks[k] = v
	}
}

// getOrInsert returns the id of the row sel finds, or inserts it.
func (w *writer) getOrInsert(sel, ins *sql.Stmt, selArgs, insArgs []any) (int64, error) {
	var id int64
	err := sel.QueryRowContext(w.ctx, selArgs...).Scan(&id)
	if err == nil {
		return id, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return 0, err
	}
	res, err := ins.ExecContext(w.ctx, insArgs...)
	if err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

func (w *writer) sample(interval int64, s *profileview.Sample) error {
	resID, ok := w.resByIndex[s.ResourceIndex]
	if !ok {
		var err error
		if resID, err = w.resource(s); err != nil {
			return fmt.Errorf("resource: %w", err)
		}
		w.resByIndex[s.ResourceIndex] = resID
	}
	stackID, ok := w.stackByIndex[s.Stack]
	if !ok {
		var err error
		if stackID, err = w.stack(s.Frames); err != nil {
			return fmt.Errorf("stack: %w", err)
		}
		w.stackByIndex[s.Stack] = stackID
	}
	var tid, cpu, threadName, other any
	clear(w.attrs)
	for _, a := range s.Attrs {
		switch a.Key {
		case attrThreadID:
			tid = intOrText(a.Value)
		case attrCPU:
			cpu = intOrText(a.Value)
		case attrThreadName:
			threadName = a.Value
		default:
			if w.attrs == nil {
				w.attrs = map[string]any{}
			}
			w.attrs[a.Key] = a.Value
		}
	}
	if len(w.attrs) > 0 {
		b, err := json.Marshal(w.attrs)
		if err != nil {
			return fmt.Errorf("sample attributes: %w", err)
		}
		other = string(b)
	}
	period := int64(0)
	if s.PeriodUnit == "nanoseconds" {
		period = s.Period
	}
	if _, err := w.insSample.ExecContext(w.ctx, interval, int64(min(s.Start, 1<<63-1)), resID, stackID,
		s.Type, s.Unit, period, s.Value, s.Events, tid, threadName, cpu, other); err != nil {
		return fmt.Errorf("insert sample: %w", err)
	}
	return nil
}

// intOrText stores a number as an integer, anything else as text.
func intOrText(v string) any {
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		return n
	}
	return v
}

func (w *writer) resource(s *profileview.Sample) (int64, error) {
	b, err := json.Marshal(s.Resource.AsRaw())
	if err != nil {
		return 0, err
	}
	key := string(b)
	if id, ok := w.e.resources[key]; ok {
		return id, nil
	}
	if id, ok := w.newResources[key]; ok {
		return id, nil
	}
	str := func(k string) any {
		if v, ok := s.Resource.Get(k); ok && v.AsString() != "" {
			return v.AsString()
		}
		return nil
	}
	var pid any
	if v, ok := s.Resource.Get(attrPID); ok {
		pid = intOrText(v.AsString())
	}
	id, err := w.getOrInsert(w.selResource, w.insResource, []any{key},
		[]any{str(attrServiceName), str(attrExeName), pid, str(attrContainerID), key})
	if err != nil {
		return 0, err
	}
	w.newResources[key] = id
	return id, nil
}

func (w *writer) function(f *profileview.Frame) (any, error) {
	if f.Function == "" && f.SystemName == "" && f.File == "" {
		return nil, nil
	}
	k := functionKey{f.Function, f.SystemName, f.File}
	if id, ok := w.e.functions[k]; ok {
		return id, nil
	}
	if id, ok := w.newFunctions[k]; ok {
		return id, nil
	}
	args := []any{k.name, k.system, k.file}
	id, err := w.getOrInsert(w.selFunction, w.insFunction, args, args)
	if err != nil {
		return nil, err
	}
	w.newFunctions[k] = id
	return id, nil
}

func (w *writer) frame(f *profileview.Frame) (int64, error) {
	fn, err := w.function(f)
	if err != nil {
		return 0, fmt.Errorf("function: %w", err)
	}
	k := frameKey{typ: f.Type, line: f.Line, address: f.Address, mapping: f.Mapping}
	if fn != nil {
		k.function = fn.(int64)
	}
	if id, ok := w.e.frames[k]; ok {
		return id, nil
	}
	if id, ok := w.newFrames[k]; ok {
		return id, nil
	}
	// SQLite integers are signed: kernel addresses are stored as their
	// two's complement (readers cast back with & 0xffffffffffffffff).
	args := []any{k.typ, fn, k.line, int64(k.address), k.mapping}
	id, err := w.getOrInsert(w.selFrame, w.insFrame, args, args)
	if err != nil {
		return 0, err
	}
	w.newFrames[k] = id
	return id, nil
}

func (w *writer) stack(frames []profileview.Frame) (int64, error) {
	w.frameIDs = w.frameIDs[:0]
	h := sha256.New()
	var buf [8]byte
	for i := range frames {
		id, err := w.frame(&frames[i])
		if err != nil {
			return 0, fmt.Errorf("frame: %w", err)
		}
		w.frameIDs = append(w.frameIDs, id)
		binary.LittleEndian.PutUint64(buf[:], uint64(id))
		h.Write(buf[:])
	}
	var key [16]byte
	copy(key[:], h.Sum(nil))
	if id, ok := w.e.stacks[key]; ok {
		return id, nil
	}
	if id, ok := w.newStacks[key]; ok {
		return id, nil
	}
	var id int64
	err := w.selStack.QueryRowContext(w.ctx, key[:]).Scan(&id)
	switch {
	case err == nil:
		w.newStacks[key] = id
		return id, nil
	case !errors.Is(err, sql.ErrNoRows):
		return 0, err
	}
	var leaf any
	if len(w.frameIDs) > 0 {
		leaf = w.frameIDs[0]
	}
	res, err := w.insStack.ExecContext(w.ctx, key[:], len(frames), leaf, language(frames))
	if err != nil {
		return 0, err
	}
	if id, err = res.LastInsertId(); err != nil {
		return 0, err
	}
	for pos, fid := range w.frameIDs {
		if _, err := w.insStackFrame.ExecContext(w.ctx, id, pos, fid); err != nil {
			return 0, err
		}
	}
	w.newStacks[key] = id
	return id, nil
}

// language is the frame type of a stack's first frame, leaf first, that is
// not the kernel's: what the thread ran in user space. A stack of kernel
// frames only is "kernel"; an empty one "".
func language(frames []profileview.Frame) string {
	for _, f := range frames {
		if f.Type != "kernel" {
			return f.Type
		}
	}
	if len(frames) > 0 {
		return "kernel"
	}
	return ""
}
