package bench

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
)

// procMem returns the process's resident set (VmRSS) and its high-water
// mark (VmHWM) in bytes, read from /proc/self/status; zeros where there is
// no such file (outside Linux).
func procMem() (rss, hwm int64) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := bytes.Cut(sc.Bytes(), []byte(":"))
		if !ok {
			continue
		}
		f := bytes.Fields(v) // "123456 kB"
		if len(f) != 2 || string(f[1]) != "kB" {
			continue
		}
		n, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil {
			continue
		}
		switch string(k) {
		case "VmRSS":
			rss = n << 10
		case "VmHWM":
			hwm = n << 10
		}
	}
	return rss, hwm
}
