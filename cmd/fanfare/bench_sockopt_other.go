//go:build !linux

package main

import "syscall"

// bindNoPort is a no-op where IP_BIND_ADDRESS_NO_PORT does not exist.
func bindNoPort(_, _ string, _ syscall.RawConn) error { return nil }
