'use strict';
// Small functions TurboFan inlines into the hot loop of inlHot.

function inlAdd(a, b) {
  return a + b;
}

function inlMul(a) {
  return inlAdd(a, a) * 3;
}

function inlHot(n) {
  let s = 0;
  for (let i = 0; i < n; i++) {
    s = (s + inlMul(i)) % 1000003;
  }
  return s;
}

function main() {
  let sum = 0;
  process.stdout.write('ready\n');
  for (;;) {
    sum = (sum + inlHot(100000)) % 1000003;
  }
}

main();
