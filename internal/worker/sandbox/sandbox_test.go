package sandbox

import (
	"errors"
	"path/filepath"
	"sync"
	"testing"
)

func TestUIDClaims(t *testing.T) {
	r := UIDRange{First: 1000, Count: 3, Dir: filepath.Join(t.TempDir(), "uids")}
	a, err := r.Claim("conv-a")
	if err != nil {
		t.Fatal(err)
	}
	if again, err := r.Claim("conv-a"); err != nil || again != a {
		t.Errorf("claiming again: %d, %v; want %d", again, err, a)
	}
	seen := map[uint32]string{a: "conv-a"}
	for _, c := range []string{"conv-b", "conv-c"} {
		u, err := r.Claim(c)
		if err != nil {
			t.Fatal(err)
		}
		if other, ok := seen[u]; ok {
			t.Fatalf("%s and %s share uid %d", c, other, u)
		}
		if u < 1000 || u >= 1003 {
			t.Fatalf("uid %d outside the range", u)
		}
		seen[u] = c
	}
	if _, err := r.Claim("conv-d"); !errors.Is(err, ErrNoUID) {
		t.Errorf("a full range: got %v, want ErrNoUID", err)
	}
}

func TestUIDClaimsRace(t *testing.T) {
	r := UIDRange{First: 5000, Count: 64, Dir: filepath.Join(t.TempDir(), "uids")}
	var mu sync.Mutex
	got := map[uint32]int{}
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			u, err := r.Claim("conv-" + string(rune('A'+i%26)) + string(rune('a'+i/26)))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			got[u]++
			mu.Unlock()
		})
	}
	wg.Wait()
	for u, n := range got {
		if n > 1 {
			t.Errorf("uid %d given to %d conversations", u, n)
		}
	}
}

func TestParseUser(t *testing.T) {
	for in, want := range map[string]User{"1000:1001": {1000, 1001}, "42": {42, 42}, "root": {0, 0}} {
		got, err := ParseUser(in)
		if err != nil || got != want {
			t.Errorf("ParseUser(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "a:b", "-1", "no-such-user-here"} {
		if _, err := ParseUser(bad); err == nil {
			t.Errorf("ParseUser(%q): want an error", bad)
		}
	}
}
