'use strict';
// Asynchronous code with CPU-bound leaves, and a worker thread. The main
// thread runs, round after round: an await chain (awaitOuter awaits
// awaitMiddle, which after an await calls awaitInner → awaitLeafBurn), a
// promise reaction (thenCallback → thenLeafBurn) and a timer
// (timerTick → timerMiddle → timerLeafBurn). A worker thread runs
// wMain → wAlpha → wBeta → wGammaBurn. Only the running function's
// synchronous callers are on the stack: awaitOuter is not, while
// awaitLeafBurn runs.

const { Worker, isMainThread, parentPort } = require('node:worker_threads');

const N = 200000;

function awaitLeafBurn(n) {
  let x = 0;
  for (let i = 0; i < n; i++) {
    x = (x * 31 + i) % 1000003;
  }
  return x;
}

async function awaitInner(n) {
  return awaitLeafBurn(n) + 1;
}

async function awaitMiddle(n) {
  await null;
  return (await awaitInner(n)) + 1;
}

async function awaitOuter(n) {
  const v = await awaitMiddle(n);
  return v + 1;
}

function thenLeafBurn(n) {
  let x = 0;
  for (let i = 0; i < n; i++) {
    x = (x * 37 + i) % 1000003;
  }
  return x;
}

function thenCallback(n) {
  return thenLeafBurn(n) + 1;
}

function timerLeafBurn(n) {
  let x = 0;
  for (let i = 0; i < n; i++) {
    x = (x * 41 + i) % 1000003;
  }
  return x;
}

function timerMiddle(n) {
  return timerLeafBurn(n) + 1;
}

function timerTick() {
  timerMiddle(N);
  round();
}

function round() {
  awaitOuter(N)
    .then(() => Promise.resolve(N).then(thenCallback))
    .then(() => setTimeout(timerTick, 0));
}

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
    sum = (sum + wAlpha(N)) % 1000003;
  }
}

if (isMainThread) {
  const w = new Worker(__filename);
  w.once('message', () => {
    process.stdout.write('ready\n');
    round();
  });
} else {
  wMain();
}
