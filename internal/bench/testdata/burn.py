# burn.py keeps one CPU busy in pure Python, in a known chain:
# <module> -> alpha -> Beta.method -> gamma_burn.


def gamma_burn(n):
    x = 0
    for i in range(n):
        x = (x * 31 + i) % 1000003
    return x


class Beta:
    def method(self, n):
        return gamma_burn(n)


def alpha(n):
    return Beta().method(n)


while True:
    alpha(200000)
