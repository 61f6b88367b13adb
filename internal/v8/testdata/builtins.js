'use strict';
// Optimized code that spends much of its time in builtins it calls: string
// concatenation, number to string, parseInt, array growth. Many of those
// builtins build no frame of their own, so a sample in one finds the
// caller's frame at rbp and the return address into hotBuiltins on top of
// the stack.

function hotBuiltins(n) {
  let s = 0;
  const a = [];
  for (let i = 0; i < n; i++) {
    s += Math.sqrt(i) + (i % 7) * 1.5;
    a.push(i);
    if (a.length > 64) a.length = 0;
    s += String(i).length + ('k' + i).charCodeAt(0);
    s += parseInt('12' + (i & 7), 10);
  }
  return s;
}

console.log('ready');
let total = 0;
for (;;) total += hotBuiltins(100000);
