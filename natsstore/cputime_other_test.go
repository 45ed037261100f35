//go:build !unix

package natsstore_test

import "time"

// cpuTime returns 0: this platform's CPU time is not read.
func cpuTime() time.Duration { return 0 }
