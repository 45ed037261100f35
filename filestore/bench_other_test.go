//go:build !linux

package filestore_test

import "os"

func fadviseDontNeed(*os.File) {}
