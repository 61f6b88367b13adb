module gochain

go 1.26
