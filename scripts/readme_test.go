// Package scripts_test checks the shell scripts of this folder that CI relies
// on; for now scripts/readme.sh, which runs the README's shell blocks.
package scripts_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runReadme runs scripts/readme.sh on a README with the given text (written to
// a temporary folder, where the blocks run) and returns its exit status,
// stdout and stderr.
func runReadme(tb testing.TB, readme string, args ...string) (int, string, string) {
	tb.Helper()
	return runReadmeEnv(tb, nil, readme, args...)
}

// runReadmeEnv is runReadme with env (KEY=value) added to the environment.
func runReadmeEnv(tb testing.TB, env []string, readme string, args ...string) (int, string, string) {
	tb.Helper()
	dir := tb.TempDir()
	path := filepath.Join(dir, "README.md")
	if err := os.WriteFile(path, []byte(readme), 0o644); err != nil {
		tb.Fatalf("write fixture: %v", err)
	}
	script, err := filepath.Abs("readme.sh")
	if err != nil {
		tb.Fatalf("locate readme.sh: %v", err)
	}
	cmd := exec.Command("bash", append([]string{script}, append(args, path)...)...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stdout.String(), stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stdout.String(), stderr.String()
	default:
		tb.Fatalf("run readme.sh: %v", err)
		return -1, "", ""
	}
}

func TestReadmeRunsShellBlocksInOrder(t *testing.T) {
	t.Parallel()
	readme := "# Fixture\n\n" +
		"```sh no-run\n" +
		"echo must-not-run; exit 7   # e.g. make run\n" +
		"```\n\n" +
		"Some text.\n\n" +
		"```sh\n" +
		"X=from-block-one\n" +
		"echo \"one $BASE_URL $TOKEN_FILE\"\n" +
		"```\n\n" +
		"```json\n" +
		"{\"not\": \"shell\"}\n" +
		"```\n\n" +
		"```\n" +
		"exit 9 plain block\n" +
		"```\n\n" +
		"```sh\n" +
		"echo \"two $X\" | cat\n" +
		"```\n"
	code, out, errOut := runReadme(t, readme, "http://127.0.0.1:1", "/tmp/token")
	if code != 0 {
		t.Fatalf("exit status %d, want 0; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	want := "one http://127.0.0.1:1 /tmp/token\ntwo from-block-one\n"
	if !strings.Contains(out, want) {
		t.Fatalf("stdout does not hold the runnable blocks' output in order:\n%s\nwant it to contain:\n%s", out, want)
	}
	if strings.Contains(out, "must-not-run") {
		t.Fatalf("a no-run block ran; stdout:\n%s", out)
	}
}

func TestReadmeFailsOnABrokenBlock(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		block    string // the body of the second ```sh block, whose first line is line 8
		wantLine string // what stderr must name
	}{
		{"failing command", "echo ok\nfalse\necho after-the-failure\n", "README.md:9"},
		{"failing command in a pipeline", "false | cat\necho after-the-failure\n", "README.md:8"},
		{"unset variable", "echo \"$NOT_SET_ANYWHERE\"\necho after-the-failure\n", "README.md:8"},
		{"curl refused (-f)", "curl -fsS -m 2 http://127.0.0.1:1/\necho after-the-failure\n", "README.md:8"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			readme := "# Fixture\n\n```sh\necho first\n```\n\n```sh\n" + tc.block + "```\n"
			code, out, errOut := runReadme(t, readme, "http://127.0.0.1:1", "/tmp/token")
			if code == 0 {
				t.Fatalf("exit status 0 for a broken block; stdout:\n%s\nstderr:\n%s", out, errOut)
			}
			if !strings.Contains(out, "first") {
				t.Fatalf("the block before the broken one did not run; stdout:\n%s\nstderr:\n%s", out, errOut)
			}
			if strings.Contains(out, "after-the-failure") {
				t.Fatalf("the run went on after the failing line; stdout:\n%s", out)
			}
			if !strings.Contains(errOut, tc.wantLine) {
				t.Fatalf("stderr does not name %s:\n%s", tc.wantLine, errOut)
			}
		})
	}
}

func TestReadmeStopsABlockThatNeverEnds(t *testing.T) {
	t.Parallel()
	// a block that starts a server (make run) without no-run would hang CI
	began := time.Now()
	code, out, errOut := runReadmeEnv(t, []string{"README_TIMEOUT=1"}, "# Fixture\n\n```sh\nsleep 30\necho after-the-sleep\n```\n", "http://127.0.0.1:1", "/tmp/token")
	if code == 0 || strings.Contains(out, "after-the-sleep") {
		t.Fatalf("exit status %d for a block that never ends (want non-zero); stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if took := time.Since(began); took > 15*time.Second {
		t.Fatalf("took %s with README_TIMEOUT=1", took)
	}
	if !strings.Contains(errOut, "README_TIMEOUT") {
		t.Fatalf("stderr does not say which limit stopped it:\n%s", errOut)
	}
}

func TestReadmeRefusesAnUnclosedBlock(t *testing.T) {
	t.Parallel()
	code, out, errOut := runReadme(t, "```sh\necho unclosed\n", "http://127.0.0.1:1", "/tmp/token")
	if code == 0 || strings.Contains(out, "unclosed") {
		t.Fatalf("exit status %d for an unclosed block (want non-zero, nothing run); stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}

// TestReadmeOfTheProjectParses checks the project's own README offline: its
// runnable blocks are valid bash and include the API walk-through. make e2e
// runs them against a live stack.
func TestReadmeOfTheProjectParses(t *testing.T) {
	t.Parallel()
	script, err := exec.Command("bash", "readme.sh", "-print", "../README.md").Output()
	if err != nil {
		t.Fatalf("readme.sh -print ../README.md: %v", err)
	}
	for _, want := range []string{"/v1/orders", "/pay", "/ship", "/cancel", "min_version", "token create"} {
		if !bytes.Contains(script, []byte(want)) {
			t.Errorf("the README's runnable blocks do not contain %q", want)
		}
	}
	check := exec.Command("bash", "-n")
	check.Stdin = bytes.NewReader(script)
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("the README's runnable blocks are not valid bash: %v\n%s", err, out)
	}
}
