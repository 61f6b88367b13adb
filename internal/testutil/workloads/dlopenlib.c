// The library dlopen.c loads.
volatile unsigned long sink;

__attribute__((noinline)) void lib_inner(void)
{
	for (int i = 0; i < 10000000; i++)
		sink += i;
}

__attribute__((noinline)) void lib_outer(void)
{
	lib_inner();
	sink++;
}
