#include <stdint.h>

void c_outer(int mode);
void c_middle(int mode);
void c_leaf(void);
