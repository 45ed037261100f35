package remote_test

import "syscall"

// childAttr makes a server process get SIGKILL when the test process
// dies (a test that times out, say), so none outlives it.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
