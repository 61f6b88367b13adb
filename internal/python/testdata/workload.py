# A workload with a known Python chain: <module> -> alpha -> Beta.method ->
# a leaf chosen by argv[1]. Tests find lines by the MARK comments.
import asyncio
import hashlib
import sys
import threading

DATA = b"sonde" * 1024


def gamma_burn():
    total = 0
    for i in range(20000):
        total += i * i  # MARK burn
    return total


def gamma_hash():
    return hashlib.sha256(DATA).digest()  # MARK hash


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


LEAVES = {"burn": gamma_burn, "hash": gamma_hash, "wait": gamma_wait}

if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "thread":
        t = threading.Thread(target=alpha, args=(gamma_burn,), daemon=True)  # MARK thread
        t.start()
        print("ready", flush=True)
        sys.stdin.read()  # MARK join
    elif mode == "async":
        print("ready", flush=True)
        asyncio.run(alpha_async())  # MARK call-async
    else:
        if mode != "wait":
            print("ready", flush=True)
        alpha(LEAVES[mode])  # MARK call-alpha
