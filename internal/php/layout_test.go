package php

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// offsetsC prints every offset of the layout from the engine's headers.
const offsetsC = `#include <stdio.h>
#include <stddef.h>
#include "php.h"
#include "zend_globals.h"
#include "zend_execute.h"
#define P(n, e) printf("%s %lld\n", n, (long long)(e))
int main(void) {
	P("APINo", ZEND_MODULE_API_NO);
	P("EGCurrentExecuteData", offsetof(zend_executor_globals, current_execute_data));
	P("EGVMStackTop", offsetof(zend_executor_globals, vm_stack_top));
	P("ExOpline", offsetof(zend_execute_data, opline));
	P("ExFunc", offsetof(zend_execute_data, func));
	P("ExCallInfo", offsetof(zend_execute_data, This.u1.type_info));
	P("ExPrev", offsetof(zend_execute_data, prev_execute_data));
	P("FnType", offsetof(zend_function, type));
	P("FnFlags", offsetof(zend_function, common.fn_flags));
	P("FnName", offsetof(zend_function, common.function_name));
	P("FnScope", offsetof(zend_function, common.scope));
	P("OpLast", offsetof(zend_op_array, last));
	P("OpOpcodes", offsetof(zend_op_array, opcodes));
	P("OpFilename", offsetof(zend_op_array, filename));
	P("OpLineStart", offsetof(zend_op_array, line_start));
	P("ClassName", offsetof(zend_class_entry, name));
	P("StrLen", offsetof(zend_string, len));
	P("StrVal", offsetof(zend_string, val));
	P("OpSize", sizeof(zend_op));
	P("OpLineno", offsetof(zend_op, lineno));
	P("CallCode", ZEND_CALL_CODE);
	P("CallTop", ZEND_CALL_TOP);
	P("ACCClosure", ZEND_ACC_CLOSURE);
	P("InternalFunction", ZEND_INTERNAL_FUNCTION);
	P("UserFunction", ZEND_USER_FUNCTION);
	P("EvalCode", ZEND_EVAL_CODE);
	return 0;
}
`

// TestLayoutMatchesHeaders compiles offsetsC against each tested engine's
// headers (Debian's php8.X-dev) and compares every offset with the table's
// layout of that version.
func TestLayoutMatchesHeaders(t *testing.T) {
	eachPHP(t, testLayoutMatchesHeaders)
}

func testLayoutMatchesHeaders(t *testing.T, php testutil.Interpreter) {
	name := "php-config" + php.Version
	config, err := exec.LookPath(name)
	if r := php.Root(); r != nil {
		config, err = r.Path("/usr/bin/"+name), nil
	}
	if err != nil {
		if testutil.InCI() {
			t.Fatalf("%s is missing (CI=true: apt-get install php%s-dev): %v", name, php.Version, err)
		}
		t.Skipf("%s is missing (php%s-dev): %v", name, php.Version, err)
	}
	out, err := exec.Command("sh", config, "--includes").Output()
	if err != nil {
		t.Fatal(err)
	}
	var incs []string
	for _, f := range strings.Fields(string(out)) {
		if r := php.Root(); r != nil && strings.HasPrefix(f, "-I/") {
			f = "-I" + r.Path(strings.TrimPrefix(f, "-I")) // another release's, where it is unpacked
		}
		incs = append(incs, f)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "offsets.c")
	if err := os.WriteFile(src, []byte(offsetsC), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "offsets")
	args := append(incs, "-w", "-o", bin, src)
	if out, err := exec.Command(testutil.RequireTool(t, "gcc"), args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out, err = exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		v, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		got[f[0]] = v
	}
	l, err := LayoutFor(php.Minor)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{
		"APINo": int64(l.APINo), "EGCurrentExecuteData": l.EGCurrentExecuteData, "EGVMStackTop": l.EGVMStackTop,
		"ExOpline": l.ExOpline, "ExFunc": l.ExFunc, "ExCallInfo": l.ExCallInfo, "ExPrev": l.ExPrev,
		"FnType": l.FnType, "FnFlags": l.FnFlags, "FnName": l.FnName, "FnScope": l.FnScope,
		"OpLast": l.OpLast, "OpOpcodes": l.OpOpcodes, "OpFilename": l.OpFilename, "OpLineStart": l.OpLineStart,
		"ClassName": l.ClassName, "StrLen": l.StrLen, "StrVal": l.StrVal, "OpSize": l.OpSize, "OpLineno": l.OpLineno,
		"CallCode": int64(l.CallCode), "CallTop": int64(l.CallTop), "ACCClosure": zendACCClosure,
		"InternalFunction": internalFunction, "UserFunction": userFunction, "EvalCode": evalCode,
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			t.Errorf("%s: headers say %d (found %v), the layout %d", k, g, ok, w)
		}
	}
}

// Every layout is its minor's, with a module API number of its year (8.0
// in 2020) and the walker's fields 8-aligned; 8.2 and 8.4 are tested. The
// offsets of both (zend8's fixed ones among them) are checked against their
// headers by TestLayoutMatchesHeaders, and each layout against the
// walker's bounds by the profiler's TestKernelPHPBounds.
func TestLayoutsConsistent(t *testing.T) {
	for _, minor := range Minors() {
		l, err := LayoutFor(minor)
		if err != nil {
			t.Fatal(err)
		}
		if l.Minor != minor {
			t.Errorf("8.%d: Minor %d", minor, l.Minor)
		}
		if l.OpOpcodes%8 != 0 || l.OpFilename%8 != 0 || l.OpLast%4 != 0 {
			t.Errorf("8.%d: last %d, opcodes %d, filename %d: not aligned", minor, l.OpLast, l.OpOpcodes, l.OpFilename)
		}
		if year := l.APINo / 10000; year != 2020+minor {
			t.Errorf("8.%d: module API %d is of %d, want %d", minor, l.APINo, year, 2020+minor)
		}
		if l.Untested != (minor != 2 && minor != 4) {
			t.Errorf("8.%d: untested %v; 8.2 and 8.4 run here", minor, l.Untested)
		}
	}
	if got := len(Minors()); got != 5 {
		t.Errorf("%d minors, want 8.0 to 8.4", got)
	}
}
