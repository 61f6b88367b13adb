// biglib is the chain lateload calls: lib_outer -> lib_middle -> lib_inner.
// The test links it with many generated functions (filler.s) so the
// library's code and unwind tables are large.
unsigned long lib_inner(unsigned long x)
{
	for (int i = 0; i < 100000; i++)
		x = x * 6364136223846793005UL + 1442695040888963407UL;
	return x;
}

unsigned long lib_middle(unsigned long x)
{
	return lib_inner(x) + 1;
}

unsigned long lib_outer(unsigned long x)
{
	return lib_middle(x) + 1;
}
