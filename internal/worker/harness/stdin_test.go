package harness

import (
	"bytes"
	"fmt"
	"io"
	"os/exec"
	"testing"
	"time"
)

// TestStdinKeepsTheOrderOfLines: send writes to the CLI's stdin itself when
// nothing is queued and queues the rest for the writer; lines of every size
// (past the pipe's 64 KiB) arrive whole and in order, also while the
// reader is not reading and the pipe is full.
func TestStdinKeepsTheOrderOfLines(t *testing.T) {
	cmd := exec.Command("cat")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{in: make(chan []byte, stdinQueue)}
	p.attachStdin(stdin)
	if p.stdin == nil {
		t.Fatal("the stdin pipe gives no raw connection: every line would take the writer's round")
	}
	wrote := make(chan struct{})
	go func() { p.writeQueued(stdin); close(wrote) }()
	got := make(chan []byte, 1)
	go func() {
		time.Sleep(50 * time.Millisecond) // the pipe fills first
		b, _ := io.ReadAll(stdout)
		got <- b
	}()

	var want bytes.Buffer
	for i := range 200 {
		line := []byte(fmt.Sprintf("%d %s\n", i, bytes.Repeat([]byte{'a' + byte(i%26)}, (i*7919)%(150<<10))))
		want.Write(line)
		if !p.send(line) {
			t.Fatalf("line %d refused", i)
		}
	}
	p.closeStdin()
	<-wrote
	b := <-got
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, want.Bytes()) {
		t.Fatalf("stdin got %d bytes, want the %d sent in order", len(b), want.Len())
	}
	if p.queued != 0 {
		t.Errorf("queued after all were written: %d, want 0", p.queued)
	}
}
