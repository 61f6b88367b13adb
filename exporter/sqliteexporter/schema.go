package sqliteexporter

// schemaVersion is PRAGMA user_version of a database this exporter created.
// A database of another non-zero version is refused at start rather than
// written in a layout its queries do not expect.
const schemaVersion = 1

// schema is the layout, created in one transaction on a new database. Times
// are Unix nanoseconds; the samples_readable view adds seconds and UTC text.
// README.md documents each table with example queries.
const schema = `
CREATE TABLE intervals (
	id                INTEGER PRIMARY KEY,
	start_unix_nano   INTEGER NOT NULL,
	end_unix_nano     INTEGER NOT NULL,
	written_unix_nano INTEGER NOT NULL
);
CREATE INDEX intervals_end ON intervals(end_unix_nano);

CREATE TABLE resources (
	id              INTEGER PRIMARY KEY,
	service_name    TEXT,
	executable_name TEXT,
	pid             INTEGER,
	container_id    TEXT,
	attributes      TEXT NOT NULL UNIQUE -- every resource attribute, a JSON object
);

CREATE TABLE functions (
	id          INTEGER PRIMARY KEY,
	name        TEXT NOT NULL,
	system_name TEXT NOT NULL,
	file        TEXT NOT NULL,
	UNIQUE (name, system_name, file)
);

CREATE TABLE frames (
	id          INTEGER PRIMARY KEY,
	frame_type  TEXT NOT NULL,    -- profile.frame.type: kernel, native, go, cpython, ...
	function_id INTEGER REFERENCES functions(id), -- NULL when the frame has no function
	line        INTEGER NOT NULL, -- 0 when unknown
	address     INTEGER NOT NULL,
	mapping     TEXT NOT NULL,    -- the mapping's file, '' when none
	UNIQUE (frame_type, function_id, line, address, mapping)
);
CREATE INDEX frames_function ON frames(function_id);

CREATE TABLE stacks (
	id            INTEGER PRIMARY KEY,
	hash          BLOB NOT NULL UNIQUE,
	depth         INTEGER NOT NULL,
	leaf_frame_id INTEGER REFERENCES frames(id),
	language      TEXT NOT NULL   -- frame type of the first frame that is not kernel
);

CREATE TABLE stack_frames (
	stack_id INTEGER NOT NULL REFERENCES stacks(id),
	position INTEGER NOT NULL,    -- 0 is the leaf
	frame_id INTEGER NOT NULL REFERENCES frames(id),
	PRIMARY KEY (stack_id, position)
) WITHOUT ROWID;
CREATE INDEX stack_frames_frame ON stack_frames(frame_id);

CREATE TABLE samples (
	interval_id    INTEGER NOT NULL REFERENCES intervals(id),
	time_unix_nano INTEGER NOT NULL, -- start of the profile (the interval)
	resource_id    INTEGER NOT NULL REFERENCES resources(id),
	stack_id       INTEGER NOT NULL REFERENCES stacks(id),
	sample_type    TEXT NOT NULL,    -- samples (on-CPU) or off_cpu
	unit           TEXT NOT NULL,    -- count or nanoseconds
	period         INTEGER NOT NULL, -- nanoseconds of CPU one on-CPU sample stands for; 0 without a period
	value          INTEGER NOT NULL,
	events         INTEGER NOT NULL, -- timestamps (events) aggregated into the row
	thread_id      INTEGER,
	thread_name    TEXT,
	cpu            INTEGER,
	attributes     TEXT              -- other sample attributes, a JSON object, or NULL
);
CREATE INDEX samples_time ON samples(time_unix_nano);
CREATE INDEX samples_interval ON samples(interval_id);
CREATE INDEX samples_stack ON samples(stack_id);
CREATE INDEX samples_resource ON samples(resource_id);

CREATE VIEW samples_readable AS
SELECT s.time_unix_nano / 1000000000 AS time,
       datetime(s.time_unix_nano / 1000000000, 'unixepoch') AS utc,
       s.time_unix_nano, s.interval_id, r.service_name, r.executable_name, r.pid, r.container_id,
       s.thread_id, s.thread_name, s.cpu, s.sample_type, s.unit, s.value,
       CASE WHEN s.sample_type = 'samples' THEN s.value * s.period ELSE 0 END AS cpu_nanos,
       st.language, lf.frame_type AS leaf_type, fn.name AS leaf_function,
       fn.file AS leaf_file, lf.line AS leaf_line, s.stack_id, s.resource_id
FROM samples s
JOIN resources r ON r.id = s.resource_id
JOIN stacks st ON st.id = s.stack_id
LEFT JOIN frames lf ON lf.id = st.leaf_frame_id
LEFT JOIN functions fn ON fn.id = lf.function_id;
`
