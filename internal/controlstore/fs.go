package controlstore

import "io/fs"

func mustSub(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err) // dir is a constant of this package
	}
	return sub
}
