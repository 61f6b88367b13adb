// The second library dlswap.c alternates: its code sits at other offsets
// than the first's, so unwinding or naming it with the first's tables would
// show.
volatile unsigned long sink;

__attribute__((noinline)) void b_pad(void)
{
	__asm__ volatile(".fill 1500, 1, 0x90");
}

__attribute__((noinline)) void b_inner(void)
{
	for (int i = 0; i < 100000; i++)
		sink ^= i * 3;
}

__attribute__((noinline)) void b_outer(void)
{
	sink++;
	b_inner();
	sink--;
}
