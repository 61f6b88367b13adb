'use strict';
// Small functions TurboFan inlines into inlHot. inlHot runs short loops
// and is called from a driver that returns to the event loop between
// batches, so it is optimized as a whole function, not on stack.

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

let sum = 0;

function batch() {
  for (let k = 0; k < 20; k++) {
    sum = (sum + inlHot(2000)) % 1000003;
  }
  setImmediate(batch);
}

process.stdout.write('ready\n');
batch();
