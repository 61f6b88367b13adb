#!/bin/bash
# compileloop.sh CXX SOURCE OBJECT: compiles SOURCE with CXX -O2 -c over and
# over until it gets SIGTERM (or SIGINT); then it kills the compile in
# flight, compiler driver and cc1plus alike (each compile runs in its own
# process group), and exits.
set -u
pg=
trap '[[ -n $pg ]] && kill -KILL -- "-$pg" 2>/dev/null; exit 0' TERM INT
while :; do
	setsid "$1" -O2 -c "$2" -o "$3" &
	pg=$!
	wait "$pg"
done
