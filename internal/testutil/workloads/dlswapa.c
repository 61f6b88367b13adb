// The first library dlswap.c alternates.
volatile unsigned long sink;

__attribute__((noinline)) void a_inner(void)
{
	for (int i = 0; i < 100000; i++)
		sink += i;
}

__attribute__((noinline)) void a_outer(void)
{
	a_inner();
	sink++;
}
