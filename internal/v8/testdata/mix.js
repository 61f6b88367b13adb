'use strict';
// Two leaves in a known mix under one chain, for a run of argv[2]
// seconds: main → nodeAlpha → nodeBeta → nodeGammaBurn (two calls in
// three) or nodeDeltaBurn (one in three). The tests compare Sonde's
// samples of it with node --cpu-prof's.

function nodeGammaBurn(n) {
  let x = 0;
  for (let i = 0; i < n; i++) {
    x = (x * 31 + i) % 1000003;
  }
  return x;
}

function nodeDeltaBurn(n) {
  let x = 1;
  for (let i = 0; i < n; i++) {
    x = (x * 17 + i) % 999983;
  }
  return x;
}

function nodeBeta(n, k) {
  return (k % 3 === 2 ? nodeDeltaBurn(n) : nodeGammaBurn(n)) + 1;
}

function nodeAlpha(n, k) {
  return nodeBeta(n, k) + 1;
}

function main() {
  const seconds = Number(process.argv[2] || 10);
  process.stdout.write('ready\n');
  const end = Date.now() + seconds * 1000;
  let sum = 0;
  for (let k = 0; Date.now() < end; k++) {
    sum = (sum + nodeAlpha(200000, k)) % 1000003;
  }
  return sum;
}

main();
