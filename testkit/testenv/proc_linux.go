package testenv

import "syscall"

// sysProcAttr makes the kernel kill the server if the test binary dies
// without calling stop, so no server outlives its tests.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
