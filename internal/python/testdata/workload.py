# A workload with a known Python chain: <module> -> alpha -> Beta.method ->
# a leaf chosen by argv[1]. Tests find lines by the MARK comments.
import asyncio
import re
import sys
import threading

TEXT = "sonde profiles python " * 200
PATTERN = re.compile(r"(\w+)\s+(?=p)(\w*o\w*)")


def gamma_burn():
    total = 0
    for i in range(20000):
        total += i * i  # MARK burn
    return total


def gamma_regex():
    return PATTERN.findall(TEXT)  # MARK regex


# Deeper than the 256 user frames a sample holds, on every version.
DEPTH = 300


def recurse(n):
    if n:
        return recurse(n - 1)  # MARK call-recurse
    while True:
        gamma_burn()  # MARK call-burn-deep


def gamma_deep():
    recurse(DEPTH)  # MARK call-deep


def gamma_wait():
    print("ready", flush=True)
    sys.stdin.read()  # MARK wait
    sys.exit(0)


class Beta:
    def method(self, leaf):
        while True:
            leaf()  # MARK call-leaf


def alpha(leaf):
    Beta().method(leaf)  # MARK call-method


async def alpha_async():
    while True:
        gamma_burn()  # MARK call-burn-async
        await asyncio.sleep(0)


LEAVES = {"burn": gamma_burn, "regex": gamma_regex, "wait": gamma_wait, "deep": gamma_deep}

if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "thread":
        t = threading.Thread(target=alpha, args=(gamma_burn,), daemon=True)  # MARK thread
        t.start()
        print("ready", flush=True)
        sys.stdin.read()  # MARK join
    elif mode == "async":
        print("ready", flush=True)
        # asyncio.run is 3.7+; a new loop runs the task on every version.
        asyncio.new_event_loop().run_until_complete(alpha_async())  # MARK call-async
    else:
        if mode != "wait":
            print("ready", flush=True)
        alpha(LEAVES[mode])  # MARK call-alpha
