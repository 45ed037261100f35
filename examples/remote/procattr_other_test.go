//go:build !linux

package remote_test

import "syscall"

// childAttr is nil where there is no parent-death signal: a server
// process of a test that dies must be killed by hand.
func childAttr() *syscall.SysProcAttr { return nil }
