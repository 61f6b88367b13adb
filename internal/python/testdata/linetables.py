# Prints, for every code object compiled from the files named in argv, its
# raw line table and the line of every instruction as the interpreter
# itself computes it: the oracle of the Go decoders.
import dis
import json
import sys


def codes(co):
    yield co
    for c in co.co_consts:
        if hasattr(c, "co_code"):
            yield from codes(c)


out = []
for path in sys.argv[1:]:
    with open(path) as f:
        top = compile(f.read(), path, "exec")
    for co in codes(top):
        lines = []
        if sys.version_info >= (3, 10):
            table = co.co_linetable
            for start, end, line in co.co_lines():
                for off in range(start, end, 2):
                    lines.append([off, line or 0])
        else:
            table = co.co_lnotab
            starts = list(dis.findlinestarts(co))
            for off in range(0, len(co.co_code), 2):
                line = co.co_firstlineno
                for s, l in starts:
                    if s <= off:
                        line = l
                lines.append([off, line])
        out.append({"name": co.co_name, "first": co.co_firstlineno, "table": table.hex(), "lines": lines})
print(json.dumps(out))
