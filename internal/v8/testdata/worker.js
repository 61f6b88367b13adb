'use strict';
// The known chain in a worker thread (its own isolate): wMain → wAlpha →
// wBeta → wGammaBurn. The main thread waits.

const { Worker, isMainThread, parentPort } = require('node:worker_threads');

function wGammaBurn(n) {
  let x = 0;
  for (let i = 0; i < n; i++) {
    x = (x * 17 + i) % 1000033;
  }
  return x;
}

function wBeta(n) {
  return wGammaBurn(n) + 1;
}

function wAlpha(n) {
  return wBeta(n) + 1;
}

function wMain() {
  let sum = 0;
  parentPort.postMessage('ready');
  for (;;) {
    sum = (sum + wAlpha(200000)) % 1000033;
  }
}

if (isMainThread) {
  const w = new Worker(__filename);
  w.on('message', () => process.stdout.write('ready\n'));
} else {
  wMain();
}
