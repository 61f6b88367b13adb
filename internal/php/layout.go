package php

import (
	"errors"
	"fmt"
)

// Layout is where one PHP 8 minor version keeps what the frame walker
// follows and the namer reads. Offsets are in bytes.
type Layout struct {
	Minor int // 8.Minor
	// APINo is ZEND_MODULE_API_NO, which the binary carries as
	// "API<n>,NTS": a second witness of the version.
	APINo int

	EGCurrentExecuteData int64 // executor_globals.current_execute_data
	// EGVMStackTop is executor_globals.vm_stack_top: the words
	// vm_stack_top, vm_stack_end, vm_stack and vm_stack_page_size, which
	// precede current_execute_data, are checked when a process is found.
	EGVMStackTop int64

	ExOpline   int64 // zend_execute_data.opline
	ExFunc     int64 // .func
	ExCallInfo int64 // .This.u1.type_info: ZEND_CALL_* flags
	ExPrev     int64 // .prev_execute_data

	FnType  int64 // zend_function.type (a byte)
	FnFlags int64 // .common.fn_flags
	FnName  int64 // .common.function_name (zend_string *)
	FnScope int64 // .common.scope (zend_class_entry *)

	OpLast      int64 // zend_op_array.last (uint32: opcodes)
	OpOpcodes   int64 // .opcodes
	OpFilename  int64 // .filename (zend_string *)
	OpLineStart int64 // .line_start (uint32)

	ClassName int64 // zend_class_entry.name (zend_string *)
	StrLen    int64 // zend_string.len
	StrVal    int64 // zend_string.val

	OpSize   int64 // sizeof(zend_op)
	OpLineno int64 // zend_op.lineno (uint32)

	CallCode uint32 // ZEND_CALL_CODE: a file's top-level code (script, include, eval)
	CallTop  uint32 // ZEND_CALL_TOP: the frame's execute_ex returns when it does

	// Untested: written from the version's published sources, never run
	// against a real PHP on this project's hosts.
	Untested bool
}

// zend_function.type values.
const (
	internalFunction = 1 // ZEND_INTERNAL_FUNCTION
	userFunction     = 2 // ZEND_USER_FUNCTION
	evalCode         = 4 // ZEND_EVAL_CODE
)

// zendACCClosure is ZEND_ACC_CLOSURE in fn_flags (the same in every 8.x).
const zendACCClosure = 1 << 22

// vmStackPageSize is ZEND_VM_STACK_PAGE_SIZE on 64-bit builds (256 KiB),
// executor_globals.vm_stack_page_size in every process.
const vmStackPageSize = 256 << 10

// layouts are the versions this package knows. 8.2 and 8.4 are checked
// against Debian's php8.2-dev and (Debian 13's) php8.4-dev headers
// (offsetof) by TestLayoutMatchesHeaders and run by the integration tests.
// 8.0, 8.1 and 8.3 are untested. Where their offsets differ from 8.2's (zend_op_array's
// last_var and filename) they are those of the structure dumps phpspy
// publishes per release for x86-64, taken from real builds' debug
// information; its dumps also agree with zend8's fixed offsets in every
// 8.x, and its 8.2 dump with every offset of the tested 8.2 it holds. APINo
// is each release's ZEND_MODULE_API_NO, as its phpinfo() prints it.
var layouts = map[int]Layout{
	0: zend8(0, 20200930, 60, 144, true),
	1: zend8(1, 20210902, 60, 144, true),
	2: zend8(2, 20220829, 76, 152, false),
	3: zend8(3, 20230831, 72, 144, true),
	4: zend8(4, 20240924, 92, 168, false),
}

// zend8 is the layout of PHP 8.minor, whose module API number is api and
// whose zend_op_array has last_var and filename at lastVar and filename.
// The rest is where PHP's headers keep it in every 8.x: the VM stack's
// four words right before executor_globals.current_execute_data, last and
// opcodes right after last_var, line_start right after filename, fn_flags
// after the type byte and its three arg_flags, the ZEND_CALL_* bits.
func zend8(minor, api int, lastVar, filename int64, untested bool) Layout {
	return Layout{Minor: minor, APINo: api,
		EGCurrentExecuteData: 488, EGVMStackTop: 488 - 32,
		ExOpline: 0, ExFunc: 24, ExCallInfo: 40, ExPrev: 48,
		FnType: 0, FnFlags: 4, FnName: 8, FnScope: 16,
		OpLast: lastVar + 4, OpOpcodes: (lastVar + 8 + 7) &^ 7, OpFilename: filename, OpLineStart: filename + 8,
		ClassName: 8, StrLen: 16, StrVal: 24,
		OpSize: 32, OpLineno: 24,
		CallCode: 1 << 16, CallTop: 1 << 17,
		Untested: untested}
}

// ErrUnknownVersion is matched by the error for a PHP whose version has no
// layout: its processes keep native stacks.
var ErrUnknownVersion = errors.New("unsupported php version")

// LayoutFunc returns the layout of PHP 8.minor, or an error matching
// ErrUnknownVersion.
type LayoutFunc func(minor int) (Layout, error)

// LayoutFor returns the table's layout of PHP 8.minor.
func LayoutFor(minor int) (Layout, error) {
	l, ok := layouts[minor]
	if !ok {
		return Layout{}, fmt.Errorf("php 8.%d: %w", minor, ErrUnknownVersion)
	}
	return l, nil
}

// Minors returns the minor versions the table knows.
func Minors() []int {
	var out []int
	for m := range layouts {
		out = append(out, m)
	}
	return out
}
