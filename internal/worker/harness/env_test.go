package harness

import (
	"strings"
	"testing"
)

func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if _, dup := m[k]; dup {
			m[k+"#dup"] = v
		}
		m[k] = v
	}
	return m
}

func TestBuildSDKEnv(t *testing.T) {
	cfg := Config{ConfigDir: "/vol/cfg", HomeDir: "/vol/home", PermissionMode: "default",
		ExtraEnv: []string{"API_TIMEOUT_MS=3000", "ANTHROPIC_API_KEY=sneaky", "TALKIDE_X=1"}}
	parent := []string{
		"PATH=/usr/bin", "HOME=/root", "ANTHROPIC_API_KEY=sk-ant-real", "TALKIDE_WORKER_IDENTITY_TOKEN=id",
		"TALKIDE_MASTER_KEYS=k", "AWS_SECRET_ACCESS_KEY=aws", "HTTPS_PROXY=http://proxy:3128", "NO_PROXY=internal",
		"CLAUDE_CONFIG_DIR=/elsewhere",
	}
	got := envMap(buildSDKEnv(cfg, parent, agentDirs{config: "/vol/cfg", home: "/vol/home", tmp: "/tmp/p/c1"}, "http://127.0.0.1:4000/c1", "talkide-local-abc"))
	want := map[string]string{
		"PATH":                 "/usr/bin",
		"HOME":                 "/vol/home",
		"ANTHROPIC_BASE_URL":   "http://127.0.0.1:4000/c1",
		"ANTHROPIC_AUTH_TOKEN": "talkide-local-abc",
		"CLAUDE_CONFIG_DIR":    "/vol/cfg",
		"CLAUDE_CODE_TMPDIR":   "/tmp/p/c1",
		"TMPDIR":               "/tmp/p/c1",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
		"HTTPS_PROXY":    "http://proxy:3128",
		"NO_PROXY":       "internal,127.0.0.1,localhost",
		"API_TIMEOUT_MS": "3000",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %q, want %q", k, got[k], v)
		}
	}
	for _, k := range []string{"ANTHROPIC_API_KEY", "TALKIDE_WORKER_IDENTITY_TOKEN", "TALKIDE_MASTER_KEYS", "TALKIDE_X", "AWS_SECRET_ACCESS_KEY", "IS_SANDBOX"} {
		if v, ok := got[k]; ok {
			t.Errorf("%s reached the CLI environment: %q", k, v)
		}
	}
	for k := range got {
		if strings.HasSuffix(k, "#dup") {
			t.Errorf("%s set twice", strings.TrimSuffix(k, "#dup"))
		}
	}
}

func TestConfigRefusesSecretsInExtraEnv(t *testing.T) {
	for _, kv := range []string{"ANTHROPIC_API_KEY=x", "ANTHROPIC_BASE_URL=http://evil", "TALKIDE_WORKER_IDENTITY_TOKEN=x", "CLAUDE_CONFIG_DIR=/x"} {
		cfg := Config{ClaudeBin: "/bin/true", ConfigDir: t.TempDir(), WorkspaceRoot: t.TempDir(), HomeDir: t.TempDir(), ExtraEnv: []string{kv}}
		if err := cfg.setDefaults(); err == nil {
			t.Errorf("extra env %s accepted", kv)
		}
	}
}
