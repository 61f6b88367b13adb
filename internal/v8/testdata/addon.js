'use strict';
// A native addon (addon.c, its path in argv[2]) in the middle of a known
// chain, two ways in turn: main → jsOuter → sonde_addon_call (C) → jsCallback
// → jsLeafBurn, a JavaScript leaf called back from C; and main → jsOuterC →
// sonde_addon_burn (C) → sonde_addon_spin, a C leaf called from JavaScript.

const addon = require(process.argv[2]);

function jsLeafBurn(n) {
  let x = 0;
  for (let i = 0; i < n; i++) {
    x = (x * 31 + i) % 1000003;
  }
  return x;
}

function jsCallback(n) {
  return jsLeafBurn(n) + 1;
}

function jsOuter(n) {
  return addon.call(jsCallback, n) + 1;
}

function jsOuterC(n) {
  return addon.burn(n) + 1;
}

function main() {
  let sum = 0;
  process.stdout.write('ready\n');
  for (;;) {
    sum = (sum + jsOuter(200000) + jsOuterC(200000)) % 1000003;
  }
}

main();
