module gocgo

go 1.26
