package embedded

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fanfare-im/fanfare/store"
)

// The kill -9 test re-executes the test binary as a child process that
// appends under load and prints one line per acked message; the parent
// SIGKILLs it mid-load, several times, and then checks that every acked
// message is stored, with dense seqs.
const (
	crashDirEnv   = "FANFARE_EMBEDDED_CRASH_DIR"
	crashRoundEnv = "FANFARE_EMBEDDED_CRASH_ROUND"
	crashGroups   = 8
	crashWorkers  = 4
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashDirEnv); dir != "" {
		os.Exit(crashChild(dir, os.Getenv(crashRoundEnv)))
	}
	code := m.Run()
	closeFixtures()
	os.Exit(code)
}

// crashChild appends until killed (or 2 minutes pass). Each acked message
// is printed as "ack gid seq cmid" after Append returned.
func crashChild(dir, round string) int {
	ctx := context.Background()
	s, err := Open(Config{Dir: dir})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child open:", err)
		return 2
	}
	for gid := int64(1); gid <= crashGroups; gid++ {
		_, err := s.CreateGroup(ctx, store.Group{GID: gid})
		if err != nil && !errors.Is(err, store.ErrGroupExists) {
			fmt.Fprintln(os.Stderr, "child create group:", err)
			return 2
		}
		if _, err := s.AddMembers(ctx, gid, []string{"w0", "w1", "w2", "w3"}); err != nil {
			fmt.Fprintln(os.Stderr, "child add members:", err)
			return 2
		}
	}
	var outMu sync.Mutex
	deadline := time.Now().Add(2 * time.Minute)
	var wg sync.WaitGroup
	for w := range crashWorkers {
		wg.Go(func() {
			sender := "w" + strconv.Itoa(w)
			var line []byte
			for n := 0; time.Now().Before(deadline); n++ {
				batch := 1 + rand.IntN(64)
				reqs := make([]store.AppendRequest, batch)
				for i := range reqs {
					cmid := fmt.Sprintf("r%s-%s-%d-%d", round, sender, n, i)
					reqs[i] = store.AppendRequest{GID: 1 + rand.Int64N(crashGroups), Sender: sender,
						ClientMsgID: cmid, Body: []byte(`{"c":"` + cmid + `"}`)}
				}
				res := make([]store.AppendResult, batch)
				if err := s.Append(ctx, reqs, res); err != nil {
					fmt.Fprintln(os.Stderr, "child append:", err)
					os.Exit(2)
				}
				line = line[:0]
				for i, r := range res {
					if r.Err != nil {
						fmt.Fprintln(os.Stderr, "child append result:", r.Err)
						os.Exit(2)
					}
					line = fmt.Appendf(line, "ack %d %d %s\n", reqs[i].GID, r.Seq, reqs[i].ClientMsgID)
				}
				outMu.Lock()
				os.Stdout.Write(line)
				outMu.Unlock()
			}
		})
	}
	wg.Wait()
	return 0
}

type ackedMsg struct {
	gid, seq int64
	cmid     string
}

// runCrashChild starts a child on dir, SIGKILLs it once it has acked at
// least killAfter messages, and returns every ack it printed in full.
func runCrashChild(t *testing.T, dir string, round, killAfter int) []ackedMsg {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashDirEnv+"="+dir, crashRoundEnv+"="+strconv.Itoa(round))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var acks []ackedMsg
	killed := false
	sc := bufio.NewScanner(out)
	timeout := time.AfterFunc(90*time.Second, func() { cmd.Process.Kill() })
	defer timeout.Stop()
	for sc.Scan() {
		var a ackedMsg
		if _, err := fmt.Sscanf(sc.Text(), "ack %d %d %s", &a.gid, &a.seq, &a.cmid); err != nil {
			// Only the last line can be cut by the kill; Scanner hands it
			// over without its newline, so it fails to parse or is short.
			continue
		}
		acks = append(acks, a)
		if !killed && len(acks) >= killAfter {
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	err = cmd.Wait()
	if !killed {
		t.Fatalf("child exited before it was killed (%v), %d acks; stderr:\n%s", err, len(acks), stderr.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child: got %v, want killed by SIGKILL; stderr:\n%s", err, stderr.String())
	}
	return acks
}

// TestKill9LosesNoAckedMessage kills a loaded writer process three times
// and checks that every message it acked survived, seqs are dense, and a
// retry of an acked message returns its original seq.
func TestKill9LosesNoAckedMessage(t *testing.T) {
	dir := t.TempDir()
	var acked []ackedMsg
	for round := range 3 {
		acks := runCrashChild(t, dir, round, 300+rand.IntN(1500))
		t.Logf("round %d: %d acks before SIGKILL", round, len(acks))
		acked = append(acked, acks...)
	}
	ctx := context.Background()
	s := openTest(t, Config{Dir: dir})
	stored := make(map[[2]int64]string) // (gid, seq) -> cmid
	where := make(map[string][2]int64)  // cmid -> (gid, seq): none stored twice
	for gid := int64(1); gid <= crashGroups; gid++ {
		var last int64
		from := int64(1)
		for {
			msgs, l, err := s.Messages(ctx, gid, "w0", from, 0, 0, 0)
			if err != nil {
				t.Fatalf("Messages(%d, %d): %v", gid, from, err)
			}
			last = l
			if len(msgs) == 0 {
				break
			}
			for _, m := range msgs {
				if m.Seq != from {
					t.Fatalf("gid %d: got seq %d, want %d (dense)", gid, m.Seq, from)
				}
				if want := `{"c":"` + m.ClientMsgID + `"}`; string(m.Body) != want {
					t.Errorf("gid %d seq %d: got body %s, want %s", gid, m.Seq, m.Body, want)
				}
				stored[[2]int64{gid, m.Seq}] = m.ClientMsgID
				if prev, dup := where[m.ClientMsgID]; dup {
					t.Errorf("%s stored twice: gid %d seq %d and gid %d seq %d", m.ClientMsgID, prev[0], prev[1], gid, m.Seq)
				}
				where[m.ClientMsgID] = [2]int64{gid, m.Seq}
				from++
			}
		}
		if from-1 != last {
			t.Errorf("gid %d: read %d messages, last_seq %d", gid, from-1, last)
		}
	}
	for _, a := range acked {
		got, ok := stored[[2]int64{a.gid, a.seq}]
		if !ok {
			t.Errorf("acked gid %d seq %d (%s) is lost", a.gid, a.seq, a.cmid)
		} else if got != a.cmid {
			t.Errorf("acked gid %d seq %d: got %s stored there, want %s", a.gid, a.seq, got, a.cmid)
		}
	}
	// Retries of acked messages answer their original seqs.
	for _, a := range acked[:min(len(acked), 200)] {
		sender := a.cmid[strings.IndexByte(a.cmid, '-')+1:]
		sender = sender[:strings.IndexByte(sender, '-')]
		res := make([]store.AppendResult, 1)
		err := s.Append(ctx, []store.AppendRequest{{GID: a.gid, Sender: sender, ClientMsgID: a.cmid, Body: []byte(`{}`)}}, res)
		if err != nil || !res[0].Duplicate || res[0].Seq != a.seq {
			t.Errorf("retry of %s: got %+v, %v; want duplicate of seq %d", a.cmid, res[0], err, a.seq)
		}
	}
	t.Logf("%d acked messages checked, %d stored (acked or in flight at the kills)", len(acked), len(stored))
}
