// Links the library whose constructor burns CPU (ldso_ctor.c).
int ldso_ctor_lib(void);

int main(void) { return ldso_ctor_lib() & 0; }
