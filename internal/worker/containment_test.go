package worker

import (
	"strings"
	"testing"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/worker/sandbox"
)

// Agent uids fit the worker's user namespace: the default range on a host
// (every id mapped), the upper part of the pod's 65536 ids in a pod with
// hostUsers: false (the default range is not mapped there), and a
// configured range outside the namespace is refused, never used.
func TestAgentUIDRangeFitsTheUserNamespace(t *testing.T) {
	r, err := agentUIDRangeIn(sandbox.UIDRange{}, 0, 1<<32-1)
	if err != nil || r.First != sandbox.DefaultUIDs.First || r.Count != sandbox.DefaultUIDs.Count {
		t.Errorf("host: %+v %v, want the default range", r, err)
	}
	r, err = agentUIDRangeIn(sandbox.UIDRange{}, 0, 65536)
	if err != nil || r.First != 20000 || uint64(r.First)+uint64(r.Count) > 65534 || r.Count < 40000 {
		t.Errorf("pod user namespace: %+v %v, want 20000 up to below nobody (65534)", r, err)
	}
	if _, err := agentUIDRangeIn(sandbox.UIDRange{First: 200000, Count: 10}, 0, 65536); err == nil || !strings.Contains(err.Error(), "maps only ids 0-65535") {
		t.Errorf("a configured range outside the namespace: %v", err)
	}
	if r, err := agentUIDRangeIn(sandbox.UIDRange{First: 30000, Count: 100}, 0, 65536); err != nil || r.First != 30000 || r.Count != 100 {
		t.Errorf("a configured range inside: %+v %v", r, err)
	}
	if _, err := agentUIDRangeIn(sandbox.UIDRange{}, 0, 1000); err == nil {
		t.Error("a namespace too small for agent uids: no error")
	}
}

// TALKIDE_CONTAINMENT_REQUIRE names guarantees; a worker whose host does
// not give one of them refuses to start, naming it and why.
func TestContainmentRequire(t *testing.T) {
	var c Config
	if err := ParseContainment(envMap{"TALKIDE_CONTAINMENT_REQUIRE": "private-proc, cgroup-limits"}.get, &c); err != nil {
		t.Fatal(err)
	}
	if err := c.validateContainment(); err != nil {
		t.Fatal(err)
	}
	rep := contract.Containment{Mode: "strict", Guarantees: []contract.Guarantee{
		{Name: contract.GuaranteePrivateProc, Held: true}, {Name: contract.GuaranteeCgroupLimits, Held: false, Detail: "no writable control group"}}}
	err := requireGuarantees(c, rep)
	if err == nil || !strings.Contains(err.Error(), "cgroup-limits (no writable control group)") || strings.Contains(err.Error(), "private-proc") {
		t.Errorf("requireGuarantees: %v", err)
	}
	rep.Guarantees[1].Held = true
	if err := requireGuarantees(c, rep); err != nil {
		t.Errorf("every required guarantee held: %v", err)
	}
	c = Config{}
	ParseContainment(envMap{"TALKIDE_CONTAINMENT_REQUIRE": "everything"}.get, &c)
	if err := c.validateContainment(); err == nil || !strings.Contains(err.Error(), `"everything" is no guarantee`) {
		t.Errorf("an unknown guarantee: %v", err)
	}
}

type envMap map[string]string

func (m envMap) get(k string) string { return m[k] }

func TestParseAgentFileLimit(t *testing.T) {
	for v, want := range map[string]int64{"250000": 250000, "none": -1} {
		var c Config
		if err := ParseContainment(envMap{"TALKIDE_AGENT_FILES": v}.get, &c); err != nil || c.AgentLimits.DiskFiles != want {
			t.Errorf("TALKIDE_AGENT_FILES=%s: %d, %v", v, c.AgentLimits.DiskFiles, err)
		}
	}
	for _, v := range []string{"0", "-5", "lots"} {
		var c Config
		if err := ParseContainment(envMap{"TALKIDE_AGENT_FILES": v}.get, &c); err == nil || !strings.Contains(err.Error(), "TALKIDE_AGENT_FILES") {
			t.Errorf("TALKIDE_AGENT_FILES=%s: %v", v, err)
		}
	}
	if d := (sandbox.Limits{}).WithDefaults().DiskFiles; d != 500000 {
		t.Errorf("default file limit %d", d)
	}
}
