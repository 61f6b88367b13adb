// Package elfx is the ELF access shared by unwinding and symbolization: a
// content-derived file id that keys every per-file cache, build-id notes,
// file-offset to virtual-address translation, separate debug files (by build
// id or .gnu_debuglink), and opening files as seen from inside another
// process's root without letting the path escape it.
//
// Every function here reads untrusted bytes (any process may map any file) and
// bounds what it reads; none of them keep state, so all are safe for
// concurrent use.
package elfx
