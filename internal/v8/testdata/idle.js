'use strict';
// Waits, for tests that only look at the process.
setInterval(() => {}, 1000);
process.stdout.write('ready\n');
