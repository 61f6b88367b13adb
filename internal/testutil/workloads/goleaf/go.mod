module goleaf

go 1.26
