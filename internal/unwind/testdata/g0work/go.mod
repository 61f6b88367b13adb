module g0work

go 1.26
