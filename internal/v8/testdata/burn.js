'use strict';
// A known chain with a CPU-bound leaf: main → nodeAlpha → nodeBeta →
// nodeGammaBurn. The tests find each function's line by its name.

function nodeGammaBurn(n) {
  let x = 0;
  for (let i = 0; i < n; i++) {
    x = (x * 31 + i) % 1000003;
  }
  return x;
}

function nodeBeta(n) {
  return nodeGammaBurn(n) + 1;
}

function nodeAlpha(n) {
  return nodeBeta(n) + 1;
}

function main() {
  let sum = 0;
  process.stdout.write('ready\n');
  for (;;) {
    sum = (sum + nodeAlpha(200000)) % 1000003;
  }
}

main();
