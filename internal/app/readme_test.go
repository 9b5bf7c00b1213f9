package app_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The README's settings tables give each variable's flag and default. A
// default that drifts from the code misleads whoever configures a process
// (the tables said TENANT_RATE 200 while the api used 1000), so every row
// is checked against the programs' own -h.
func TestREADMESettingsMatchTheFlags(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// program → variable → its flag and default, from the program's usage
	type flagDefault struct{ flag, def string }
	programs := map[string]map[string]flagDefault{}
	for _, prog := range []string{"api", "projector", "worker", "fakepsp"} {
		cmd := exec.Command("go", "run", "./cmd/"+prog, "-h")
		cmd.Dir = root
		out, _ := cmd.CombinedOutput() // -h may exit 0 or 2; the usage is what counts
		vars := map[string]flagDefault{}
		var flag string
		sc := bufio.NewScanner(strings.NewReader(string(out)))
		for sc.Scan() {
			line := sc.Text()
			if m := usageFlag.FindStringSubmatch(line); m != nil {
				flag = m[1]
				continue
			}
			if m := usageEnv.FindStringSubmatch(line); m != nil && flag != "" {
				vars[m[1]] = flagDefault{flag: flag, def: strings.Trim(m[2], `"`)}
			}
		}
		if len(vars) < 5 {
			t.Fatalf("go run ./cmd/%s -h: found %d settings in its usage, want many:\n%s", prog, len(vars), out)
		}
		programs[prog] = vars
	}

	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, row := range readmeRow.FindAllStringSubmatch(string(readme), -1) {
		env, flag, cell := row[1], row[2], strings.TrimSpace(row[3])
		// "`v`", "`v` (note)" or "`v` api, `w` projector"
		for _, part := range strings.Split(cell, ", ") {
			m := cellValue.FindStringSubmatch(part)
			if m == nil || strings.HasPrefix(m[1], "$") {
				continue // prose ("all", "empty (off)") or another variable
			}
			value, only := m[1], m[2]
			for prog, vars := range programs {
				fd, ok := vars[env]
				if !ok || (only != "" && only != prog) {
					continue
				}
				checked++
				if fd.flag != flag {
					t.Errorf("README: %s is -%s, but %s reads it into -%s", env, flag, prog, fd.flag)
				}
				if !sameDefault(value, fd.def) {
					t.Errorf("README: %s defaults to %q, but %s's -%s defaults to %q", env, value, prog, fd.flag, fd.def)
				}
			}
		}
	}
	if checked < 40 {
		t.Fatalf("checked only %d README defaults against the programs; did the tables' format change?", checked)
	}
}

var (
	// "  -tenant-rate int" (a flag of PrintDefaults)
	usageFlag = regexp.MustCompile(`^  -([a-z0-9-]+)`)
	// its usage line: "… ($TENANT_RATE) (default 1000)"; no default: zero
	usageEnv = regexp.MustCompile(`\(\$([A-Z0-9_]+)\)(?: \(default (.*)\))?$`)
	// "| `TENANT_RATE` | `-tenant-rate` | `1000` | …"
	readmeRow = regexp.MustCompile("(?m)^\\| `([A-Z0-9_]+)` \\| `-([a-z0-9-]+)` \\| ([^|]*) \\|")
	// "`1000`", "`0` (keep)", "`20` api"
	cellValue = regexp.MustCompile("^`([^`]*)`(?: ([a-z]+))?")
)

// sameDefault compares a README default with a flag's: durations by value
// ("1m" is "1m0s"), the zero values PrintDefaults leaves out as "".
func sameDefault(readme, flag string) bool {
	if readme == flag {
		return true
	}
	if flag == "" {
		return readme == "0" || readme == "false" || readme == "0s"
	}
	a, errA := time.ParseDuration(readme)
	b, errB := time.ParseDuration(flag)
	return errA == nil && errB == nil && a == b
}
