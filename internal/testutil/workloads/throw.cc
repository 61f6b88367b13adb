// throw burns CPU in c, which then throws through b to a catch in a:
// main -> a -> b -> c.
volatile unsigned long sink;

extern "C" __attribute__((noinline)) void c(int n)
{
	for (int i = 0; i < 5000000; i++)
		sink += i;
	if (n % 2 == 0)
		throw n;
}

extern "C" __attribute__((noinline)) void b(int n)
{
	c(n);
	sink++;
}

extern "C" __attribute__((noinline)) void a(int n)
{
	try {
		b(n);
	} catch (int e) {
		sink += e;
	}
}

int main()
{
	for (int n = 0;; n++)
		a(n);
}
