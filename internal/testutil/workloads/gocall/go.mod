module gocall

go 1.26
