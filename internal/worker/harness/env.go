package harness

import (
	"os"
	"strings"
)

// inheritedEnv are the only variables of the worker's own environment a CLI
// process inherits. Everything else (notably ANTHROPIC_API_KEY and the
// worker's TALKIDE_* secrets) is left out, so neither the CLI nor any tool it
// runs can read them.
var inheritedEnv = map[string]bool{
	"PATH": true, "LANG": true, "LC_ALL": true, "LC_CTYPE": true, "TZ": true, "TERM": true,
	"SSL_CERT_FILE": true, "SSL_CERT_DIR": true,
	"HTTP_PROXY": true, "HTTPS_PROXY": true, "NO_PROXY": true,
	"http_proxy": true, "https_proxy": true, "no_proxy": true,
}

func envName(kv string) string {
	name, _, _ := strings.Cut(kv, "=")
	return name
}

// forbiddenEnv reports whether a variable must never reach a CLI process
// through configuration.
func forbiddenEnv(name string) bool {
	switch name {
	case "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "CLAUDE_CONFIG_DIR":
		return true
	}
	return strings.HasPrefix(name, "TALKIDE_")
}

// agentDirs are one conversation's CLI directories.
type agentDirs struct{ config, home, tmp string }

// buildSDKEnv returns the environment of a CLI process (the design's
// buildSdkEnv): an allow-list of the worker's environment, then the model
// endpoint (baseURL, the local gateway proxy with the conversation prefix)
// and its placeholder credential, the session volume paths, the private tmp
// dir, the switches that keep the CLI off every host but the endpoint, and
// cfg.ExtraEnv.
func buildSDKEnv(cfg Config, parent []string, dirs agentDirs, baseURL, placeholder string) []string {
	env := map[string]string{}
	for _, kv := range parent {
		if name, val, ok := strings.Cut(kv, "="); ok && inheritedEnv[name] {
			env[name] = val
		}
	}
	if env["PATH"] == "" {
		env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
	}
	// Model calls go to 127.0.0.1: never through an HTTP proxy.
	for _, k := range []string{"NO_PROXY", "no_proxy"} {
		if v := env[k]; v != "" {
			env[k] = v + ",127.0.0.1,localhost"
		} else {
			env[k] = "127.0.0.1,localhost"
		}
	}
	set := map[string]string{
		"ANTHROPIC_BASE_URL":   baseURL,
		"ANTHROPIC_AUTH_TOKEN": placeholder,
		"CLAUDE_CONFIG_DIR":    dirs.config,
		"HOME":                 dirs.home,
		"CLAUDE_CODE_TMPDIR":   dirs.tmp,
		"TMPDIR":               dirs.tmp,
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
		"DISABLE_TELEMETRY":                        "1",
		"DISABLE_AUTOUPDATER":                      "1",
		"BUN_ENABLE_CRASH_REPORTING":               "0",
	}
	if cfg.PermissionMode == "bypassPermissions" && os.Geteuid() == 0 {
		set["IS_SANDBOX"] = "1" // the CLI refuses bypassPermissions as root otherwise
	}
	for k, v := range set {
		env[k] = v
	}
	for _, kv := range cfg.ExtraEnv {
		if name, val, ok := strings.Cut(kv, "="); ok && !forbiddenEnv(name) {
			env[name] = val
		}
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}
