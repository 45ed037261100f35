// Package crashtest runs the test binary again as a child process and
// kills it in the middle of its work, for the crash-recovery tests of
// ferry and filestore.
package crashtest

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"time"
)

// Idle is how long Run waits for a child's next line before it kills it.
var Idle = 2 * time.Minute

// Run starts the running test binary with no test selected and env added
// to its environment: the child's TestMain sees its variable and does the
// work, writing a line to stdout per step. The child's stdin stays open
// while it runs, so a child that reads it ends with its parent. Run kills
// the child once it has written after lines (at once when after is 0),
// or when it has written nothing for Idle (a hung child: the caller sees
// fewer lines than it asked for), and returns the lines it wrote, its
// stderr and when it was killed.
func Run(env []string, after int) (lines []string, stderr string, killed time.Time, err error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	var errs bytes.Buffer
	cmd.Stderr = &errs
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, "", time.Time{}, err
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", time.Time{}, err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", time.Time{}, err
	}
	reached := make(chan struct{})
	wrote := make(chan struct{}, 1)
	out := make(chan []string, 1)
	go func() {
		var got []string
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			got = append(got, sc.Text())
			select {
			case wrote <- struct{}{}:
			default:
			}
			if len(got) == after {
				close(reached)
			}
		}
		if len(got) < after {
			close(reached)
		}
		out <- got
	}()
	if after > 0 {
		idle := time.NewTimer(Idle)
	wait:
		for {
			select {
			case <-reached:
				break wait
			case <-wrote:
				idle.Reset(Idle)
			case <-idle.C:
				break wait // hung: killed with what it wrote
			}
		}
		idle.Stop()
	}
	err = cmd.Process.Kill()
	killed = time.Now()
	lines = <-out // read to the end before Wait closes the pipe
	_ = cmd.Wait()
	return lines, errs.String(), killed, err
}
