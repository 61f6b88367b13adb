'use strict';
// A long-running process whose heap churns: functions compiled from
// source at run time (new Function, eval), objects allocated and dropped
// so that the garbage collector runs and moves objects, code optimized
// and thrown away.

const keep = [];

function churnMake(i) {
  const body = 'let s = 0; for (let k = 0; k < n; k++) { s += k % ' + ((i % 7) + 2) + '; } return s;';
  return new Function('n', body);
}

function churnAlloc(n) {
  const a = [];
  for (let i = 0; i < n; i++) {
    a.push({ i, s: 'x' + i });
  }
  keep.push(a);
  if (keep.length > 20) {
    keep.shift();
  }
  return a.length;
}

function churnEval(i) {
  return eval('(function churnEvaled(n) { let t = 0; for (let k = 0; k < n; k++) { t ^= k * ' + i + '; } return t; })')(3000);
}

function churnLoop() {
  let total = 0;
  for (let i = 0; ; i++) {
    const f = churnMake(i);
    total = (total + f(5000) + churnAlloc(2000) + churnEval(i)) % 1000003;
    if (i === 0) {
      process.stdout.write('ready\n');
    }
  }
}

churnLoop();
