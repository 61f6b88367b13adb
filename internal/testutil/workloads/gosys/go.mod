module gosys

go 1.26
