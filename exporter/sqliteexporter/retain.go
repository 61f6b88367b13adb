package sqliteexporter

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// retain deletes intervals older than max_age (at most once a minute) and,
// while the pages in use exceed max_size_mib, the oldest intervals; then it
// removes the stacks, frames, functions and resources no sample refers to
// and gives the free pages back to the file system.
func (e *sqliteExporter) retain(ctx context.Context, now time.Time) error {
	byAge := e.cfg.MaxAge > 0 && now.Sub(e.lastRetention) >= retentionEvery
	deleted := false
	if byAge {
		e.lastRetention = now
		n, err := e.deleteIntervals(ctx, "end_unix_nano < ?", now.Add(-e.cfg.MaxAge).UnixNano())
		if err != nil {
			return fmt.Errorf("delete by age: %w", err)
		}
		if n > 0 {
			e.tb.ExporterSqliteDeletedIntervals.Add(ctx, n, reasonMaxAge)
			deleted = true
		}
	}
	if deleted {
		if err := e.collect(ctx); err != nil {
			return err
		}
	}
	if e.cfg.MaxSizeMiB == 0 {
		return nil
	}
	limit := e.cfg.MaxSizeMiB << 20
	for {
		used, err := e.usedBytes(ctx)
		if err != nil {
			return err
		}
		if used <= limit {
			return nil
		}
		var count int64
		if err := e.db.QueryRowContext(ctx, "SELECT count(*) FROM intervals").Scan(&count); err != nil {
			return fmt.Errorf("count intervals: %w", err)
		}
		if count == 0 {
			return nil // nothing left to delete: the tables of names alone exceed the bound
		}
		k := max(1, int64(float64(count)*sizeDeleteFraction))
		n, err := e.deleteIntervals(ctx, "id IN (SELECT id FROM intervals ORDER BY id LIMIT ?)", k)
		if err != nil {
			return fmt.Errorf("delete by size: %w", err)
		}
		e.tb.ExporterSqliteDeletedIntervals.Add(ctx, n, reasonMaxSize)
		if err := e.collect(ctx); err != nil {
			return err
		}
	}
}

// usedBytes is the size of the database's pages in use.
func (e *sqliteExporter) usedBytes(ctx context.Context) (int64, error) {
	var pages, free, size int64
	for _, q := range []struct {
		pragma string
		v      *int64
	}{{"page_count", &pages}, {"freelist_count", &free}, {"page_size", &size}} {
		if err := e.db.QueryRowContext(ctx, "PRAGMA "+q.pragma).Scan(q.v); err != nil {
			return 0, fmt.Errorf("%s: %w", q.pragma, err)
		}
	}
	return (pages - free) * size, nil
}

// deleteIntervals deletes the intervals matching where, and their samples,
// in one transaction, and returns how many intervals it deleted.
func (e *sqliteExporter) deleteIntervals(ctx context.Context, where string, arg any) (n int64, err error) {
	tx, err := e.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if _, err := tx.ExecContext(ctx, "DELETE FROM samples WHERE interval_id IN (SELECT id FROM intervals WHERE "+where+")", arg); err != nil {
		return 0, err
	}
	res, err := tx.ExecContext(ctx, "DELETE FROM intervals WHERE "+where, arg)
	if err != nil {
		return 0, err
	}
	if n, err = res.RowsAffected(); err != nil {
		return 0, err
	}
	return n, tx.Commit()
}

// collect removes rows no sample refers to any more, in one transaction, and
// returns the freed pages to the file system. The id caches may name
// removed rows: they are emptied.
func (e *sqliteExporter) collect(ctx context.Context) (err error) {
	e.clearCaches()
	tx, err := e.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("collect: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	for _, q := range []string{
		"DELETE FROM stacks WHERE NOT EXISTS (SELECT 1 FROM samples WHERE samples.stack_id = stacks.id)",
		"DELETE FROM stack_frames WHERE NOT EXISTS (SELECT 1 FROM stacks WHERE stacks.id = stack_frames.stack_id)",
		"DELETE FROM frames WHERE NOT EXISTS (SELECT 1 FROM stack_frames WHERE stack_frames.frame_id = frames.id)",
		"DELETE FROM functions WHERE NOT EXISTS (SELECT 1 FROM frames WHERE frames.function_id = functions.id)",
		"DELETE FROM resources WHERE NOT EXISTS (SELECT 1 FROM samples WHERE samples.resource_id = resources.id)",
	} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("collect: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("collect: %w", err)
	}
	// Free pages go back to the file system; the WAL is checkpointed into
	// the database and truncated so the files' size follows.
	for _, q := range []string{"PRAGMA incremental_vacuum", "PRAGMA wal_checkpoint(TRUNCATE)"} {
		if err := drain(ctx, e.db, q); err != nil {
			return fmt.Errorf("collect: %s: %w", q, err)
		}
	}
	return nil
}

// drain runs a statement that returns rows and reads them all: SQLite
// performs incremental_vacuum one step per row read.
func drain(ctx context.Context, db *sql.DB, q string) error {
	rows, err := db.QueryContext(ctx, q)
	if err != nil {
		return err
	}
	for rows.Next() {
	}
	if err := rows.Err(); err != nil {
		_ = rows.Close()
		return err
	}
	return rows.Close()
}
