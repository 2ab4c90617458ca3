//go:build race

package socket

func init() { raceEnabled = true }
